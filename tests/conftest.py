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


@pytest.fixture(autouse=True)
def fresh_dataset_cache():
    """Every test parses dataset files anew (llm_zoo.data.files.cached_load keeps them per
    process): a test that expects a loader's warning, or breaks a loader on purpose, must not get
    a file an earlier test has parsed."""
    from llm_zoo.data.files import clear_cache

    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test: on a shared 2-core machine more threads make the tiny model
    10x slower. Trainer-loop test modules use it for every test (``pytestmark``)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def no_model_loading(monkeypatch):
    """Fail the test if anything tries to load a model."""
    pytest.importorskip("torch")
    import llm_zoo_train.models.policy

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded although the config is bad")

    monkeypatch.setattr(llm_zoo_train.models.policy, "load_base_model", forbidden)
