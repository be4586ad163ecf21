"""A Griffe extension: environment module docstrings rendered as Markdown on the API pages.

The module docstrings of ``llm_zoo.envs.*`` follow the PettingZoo-style layout (definition lists
``Term`` + an indented body, ``::`` literal blocks) that Markdown would turn into code blocks. This
extension passes them through the same converter as the generated environment pages
(:func:`docgen.docstring_to_markdown`), so both read alike. Other docstrings are left alone.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import griffe


def _docgen() -> Any:
    name = "llm_zoo_docgen"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("docgen.py"))
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class EnvDocstrings(griffe.Extension):
    """Convert the module docstring of every ``llm_zoo.envs.<name>`` module (not the package)."""

    def on_module_members(self, *, mod: griffe.Module, **kwargs: Any) -> None:
        if not mod.path.startswith("llm_zoo.envs.") or mod.docstring is None:
            return
        summary, _, body = mod.docstring.value.partition("\n\n")
        mod.docstring.value = f"{summary}\n\n{_docgen().docstring_to_markdown(body, level=2)}"
