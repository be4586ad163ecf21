import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Path of a tiny random Llama chat model + tokenizer (see tests/tiny_model.py)."""
    pytest.importorskip("torch")
    from tiny_model import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_model"))
