"""The package layout is the architecture: each stage imports only the stages below it.

The import graph is read from the source (every ``import``, at module level or inside a function,
under ``TYPE_CHECKING`` or not), so a lazy import that runs back up the stages fails here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: llm_zoo_train's stages, lowest first; a module may import its own stage and those before it.
#: The top-level modules (``trainer``, ``trainer_state``, ``__main__``) are the last stage.
TRAIN_STAGES = (
    "config",
    "runs",
    "kernels",
    "models",
    "engines",
    "rollout",
    "training",
    "reporting",
    "evaluation",
    "",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path) -> list[tuple[str, list[str]]]:
    """``(imported module, names taken from it)`` for every import statement of the file."""
    module = module_name(path)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((resolve(module, path, node), [alias.name for alias in node.names]))
    return found


def modules(package: str) -> dict[str, Path]:
    return {module_name(path): path for path in sorted((SRC / package).rglob("*.py"))}


def internal_edges(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (``from pkg import submodule`` included)."""
    known = modules(package)
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for imported, names in imports_of(path):
            submodules = {f"{imported}.{n}" for n in names} & known.keys()
            # ``from pkg import submodule`` imports the submodule; any other name comes from ``pkg``
            candidates = submodules | ({imported} if len(submodules) < len(names) or not names else set())
            targets |= {c for c in candidates if c in known and c != name}
        edges[name] = targets
    return edges


def stage_of(module: str) -> int:
    parts = module.split(".")
    first = parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in TRAIN_STAGES) else ""
    return TRAIN_STAGES.index(first)


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    """One import cycle as a path of modules, or ``[]``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_every_train_module_belongs_to_a_stage():
    for module in modules("llm_zoo_train"):
        parts = module.split(".")
        if len(parts) > 2:
            assert parts[1] in TRAIN_STAGES, f"{module}: {parts[1]}/ is not one of the stages {TRAIN_STAGES}"


@pytest.mark.parametrize("package", ["llm_zoo", "llm_zoo_train"])
def test_no_import_cycle(package):
    # The packages' own __init__ modules gather public names; they import their submodules, and a
    # submodule importing its package's public name would be a cycle too, so they are included.
    assert find_cycle(internal_edges(package)) == []


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_no_train_stage_imports_a_later_one():
    upward = []
    for module, targets in internal_edges("llm_zoo_train").items():
        for target in targets:
            if target != "llm_zoo_train" and stage_of(target) > stage_of(module):
                upward.append(f"{module} -> {target}")
    assert upward == [], "imports from a lower stage up to a higher one:\n" + "\n".join(sorted(upward))


def test_stage_of_reads_the_first_package():
    assert TRAIN_STAGES[stage_of("llm_zoo_train.config.sections")] == "config"
    assert TRAIN_STAGES[stage_of("llm_zoo_train.rollout")] == "rollout"
    assert stage_of("llm_zoo_train.trainer") == len(TRAIN_STAGES) - 1
    assert stage_of("llm_zoo_train.rollout.tree") < stage_of("llm_zoo_train.training.update")


def test_llm_zoo_never_imports_torch_or_the_trainer():
    found = []
    for module, path in modules("llm_zoo").items():
        for imported, _ in imports_of(path):
            if imported.split(".")[0] in ("torch", "llm_zoo_train", "transformers", "peft", "vllm"):
                found.append(f"{module} imports {imported}")
    assert found == []


def test_sandbox_and_checkers_import_no_env():
    # The sandbox and the checkers are what envs are built on; they never reach back into an env.
    found = []
    for package in ("llm_zoo.sandbox", "llm_zoo.checkers"):
        for module, path in modules(package.replace(".", "/")).items():
            for imported, _ in imports_of(path):
                if imported.startswith(("llm_zoo.envs", "llm_zoo.core", "llm_zoo.serve", "llm_zoo.registry")):
                    found.append(f"{module} imports {imported}")
    assert found == []


@pytest.mark.parametrize("package", ["llm_zoo", "llm_zoo_train"])
def test_no_module_takes_another_modules_private_name(package):
    taken = []
    for module, path in modules(package).items():
        for imported, names in imports_of(path):
            if imported.split(".")[0] in ("llm_zoo", "llm_zoo_train") and imported != module:
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                taken += [f"{module}: from {imported} import {n}" for n in private]
    assert taken == []


#: Most lines a module of src/ may hold, its module docstring apart: one concept per module. An env
#: module's docstring is the env's documentation (PettingZoo's style) and may be long.
MAX_MODULE_LINES = 600


def code_lines(path: Path) -> int:
    """The module's lines without its module docstring."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    first = tree.body[0] if tree.body else None
    docstring = (
        first.end_lineno - first.lineno + 1
        if isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        else 0
    )
    return len(source.splitlines()) - (docstring or 0)


@pytest.mark.parametrize("package", ["llm_zoo", "llm_zoo_train"])
def test_no_module_is_over_600_lines_of_code(package):
    long = {module: code_lines(path) for module, path in modules(package).items()}
    assert {m: n for m, n in long.items() if n > MAX_MODULE_LINES} == {}


def test_code_lines_leave_out_the_module_docstring_only(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""One.\n\nThree."""\n\nx = 1\n"""not the module docstring"""\n', encoding="utf-8")
    assert code_lines(module) == 3
    module.write_text("x = 1\n", encoding="utf-8")
    assert code_lines(module) == 1
