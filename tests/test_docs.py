"""The documentation is true: every code block in docs/ runs, and the site builds without warnings.

Every fenced block of every hand-written page under ``docs/`` is collected and, by its language:

* ``python``: run as a script in a fresh subprocess, from an empty temporary directory;
* ``bash`` / ``console`` / ``shell``: run with ``bash -euo pipefail`` from an empty temporary
  directory holding a link to the repository's ``examples/`` (the venv's scripts first on PATH);
* ``yaml``, ``toml``, ``json``: parsed; a yaml block marked ``<!-- test: config -->`` is also
  loaded and validated as an ``llm-zoo-train`` configuration (no model is loaded);
* ``text``: shown output or a picture, not code; a text block marked
  ``<!-- test: output-of-previous -->`` must appear, line by line, in the output of the block
  before it;
* a block that only includes files (``--8<-- "path"``): the files must exist (they are tested
  where they live, e.g. the plugin example's own tests).

An HTML comment right above a block changes that: ``<!-- skip-test: REASON -->`` (needs a GPU,
runs for minutes, installs packages) skips it with its reason, and ``<!-- requires: mod, ... -->``
skips it when a module is not installed. Skipped blocks show up in ``pytest -ra``'s summary and
are counted by :func:`test_every_block_is_accounted_for` (``pytest -s`` prints the counts).

``test_mkdocs_build_strict`` builds the site with ``mkdocs build --strict`` when mkdocs is
installed (``nox -s docs`` installs it), and is skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import typing
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
BLOCK_TIMEOUT_S = 120

RUNNABLE = {"python", "bash", "console", "shell", "sh"}
PARSED = {"yaml", "toml", "json"}
DISPLAY = {"text"}
MARKER = re.compile(r"<!--\s*(skip-test|requires|test)\s*:\s*(.*?)\s*-->")
TEST_MARKERS = {"config", "output-of-previous"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)[^\n]*$")
SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')


@dataclass
class Block:
    page: str
    line: int
    lang: str
    code: str
    markers: dict[str, str]
    previous: Block | None = None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}:{self.lang or 'none'}"


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_gen" not in p.parts)


def parse_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of one Markdown page, with the markers written right above them."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        indent, fence, lang = len(match["indent"]), match["fence"], match["lang"].lower()
        start = index
        body = []
        index += 1
        while index < len(lines):
            line = lines[index]
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                break
            body.append(line[indent:] if line[:indent].strip() == "" else line)
            index += 1
        index += 1
        markers: dict[str, str] = {}
        above = start - 1
        while above >= 0 and (not lines[above].strip() or MARKER.search(lines[above])):
            for kind, value in MARKER.findall(lines[above]):
                markers.setdefault(kind, value)
            above -= 1
        block = Block(str(path.relative_to(REPO)), start + 1, lang, "\n".join(body) + "\n", markers)
        block.previous = blocks[-1] if blocks else None
        blocks.append(block)
    return blocks


ALL_BLOCKS = [block for page in _pages() for block in parse_blocks(page)]


def _kind(block: Block) -> str:
    lines = [line for line in block.code.split("\n") if line.strip()]
    if lines and all(SNIPPET.match(line) for line in lines):
        return "included"
    if "skip-test" in block.markers:
        return "skipped"
    if block.lang in RUNNABLE:
        return "run"
    if block.lang in PARSED:
        return "parsed"
    if block.lang in DISPLAY:
        return "display"
    return "unknown"


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTHONPATH", None)
    return env


def run_block(block: Block, workdir: Path) -> subprocess.CompletedProcess[str]:
    """Run a python or shell block from ``workdir``; return the finished process."""
    (workdir / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    if block.lang == "python":
        script = workdir / "block.py"
        script.write_text(block.code, encoding="utf-8")
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-euo", "pipefail", "-c", block.code]
    return subprocess.run(
        command,
        cwd=workdir,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def _skip_for_requirements(block: Block) -> None:
    if "requires" in block.markers:
        missing = [
            m.strip()
            for m in block.markers["requires"].split(",")
            if importlib.util.find_spec(m.strip()) is None
        ]
        if missing:
            pytest.skip(f"{block.id}: needs {', '.join(missing)}")


_OUTPUTS: dict[str, str] = {}


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.id for b in ALL_BLOCKS])
def test_doc_block(block: Block, tmp_path: Path) -> None:
    kind = _kind(block)
    if kind == "skipped":
        pytest.skip(f"{block.id}: {block.markers['skip-test']}")
    if kind == "unknown":
        pytest.fail(
            f"{block.id}: a block in language {block.lang!r} is neither run nor parsed; give it a "
            f"language among {sorted(RUNNABLE | PARSED | DISPLAY)} or a <!-- skip-test: why --> marker"
        )
    _skip_for_requirements(block)
    if kind == "included":
        for line in block.code.split("\n"):
            if SNIPPET.match(line):
                assert (REPO / SNIPPET.match(line)[1]).is_file(), f"{block.id}: included file missing"
        return
    if kind == "run":
        result = run_block(block, tmp_path)
        output = result.stdout + result.stderr
        _OUTPUTS[block.id] = result.stdout  # what a shown output block is compared with
        assert result.returncode == 0, f"{block.id} failed (exit {result.returncode}):\n{output[-4000:]}"
        return
    if kind == "parsed":
        if block.lang == "yaml":
            data = yaml.safe_load(block.code)
            if block.markers.get("test") == "config":
                _check_training_config(block, data, tmp_path)
        elif block.lang == "toml":
            tomllib = pytest.importorskip("tomllib", reason="Python < 3.11")
            tomllib.loads(block.code)
        else:
            import json

            json.loads(block.code)
        return
    # display
    if block.markers.get("test") == "output-of-previous":
        previous = block.previous
        assert previous is not None and _kind(previous) == "run", f"{block.id}: no runnable block before it"
        if previous.id not in _OUTPUTS:
            _skip_for_requirements(previous)
            _OUTPUTS[previous.id] = run_block(previous, tmp_path).stdout
        # Compared with runs of spaces collapsed: column widths depend on what is installed.
        produced = [" ".join(line.split()) for line in _OUTPUTS[previous.id].split("\n") if line.strip()]
        shown = [" ".join(line.split()) for line in block.code.split("\n") if line.strip()]
        problem = shown_output_problem(shown, produced)
        assert problem is None, (
            f"{block.id}: the output shown is not what {previous.id} prints: {problem}\n"
            "actual output:\n" + "\n".join(produced)
        )


def shown_output_problem(shown: list[str], produced: list[str]) -> str | None:
    """Why ``shown`` (a page's output block) is not ``produced`` (what the block before printed),
    or ``None``: each shown line must be part of its own produced line, in order, and every
    produced line must be shown, except where a shown line ``...`` stands for any lines left out.
    An empty shown block, a missing line, an extra line and a wrong value all fail."""
    if not shown:
        return "the block shows no output (write the output, or ... for lines left out)"
    # matched[i][j]: shown[:i] accounts for produced[:j] exactly
    matched = [[False] * (len(produced) + 1) for _ in range(len(shown) + 1)]
    matched[0][0] = True
    for i, line in enumerate(shown, start=1):
        for j in range(len(produced) + 1):
            if line == "...":
                matched[i][j] = matched[i - 1][j] or (j > 0 and matched[i][j - 1])
            else:
                matched[i][j] = j > 0 and matched[i - 1][j - 1] and line in produced[j - 1]
    if matched[-1][-1]:
        return None
    missing = next((line for line in shown if line != "..." and not any(line in p for p in produced)), None)
    if missing is not None:
        return f"no printed line holds the shown line:\n{missing}"
    return "the lines differ in number or order (a '...' line stands for lines left out)"


def test_a_shown_output_that_is_wrong_fails():
    """Every shown output is compared: a wrong value, a missing or extra line, a wrong order and an
    empty block fail; ``...`` stands for lines left out."""
    printed = ["Code-v0 writes code", "Math-v0 does math", "MathRelay-v0 relays", "PlanPath-v0 plans"]
    assert shown_output_problem(list(printed), printed) is None
    assert shown_output_problem(["Code-v0", "...", "PlanPath-v0 plans"], printed) is None
    assert shown_output_problem(["...", "MathRelay-v0 relays", "..."], printed) is None
    assert "no printed line" in shown_output_problem(["Code-v0 writes kode", "..."], printed)
    missing_one = [printed[0], printed[1], printed[3]]  # the getting-started list without MathRelay-v0
    assert "differ in number or order" in shown_output_problem(missing_one, printed)
    assert shown_output_problem([*printed, "Sokoban-v0 pushes"], printed) is not None
    assert shown_output_problem(list(reversed(printed)), printed) is not None
    assert "shows no output" in shown_output_problem([], printed)


def _check_training_config(block: Block, data: object, tmp_path: Path) -> None:
    pytest.importorskip("llm_zoo_train.config", reason="the trainer is not installed")
    from llm_zoo_train.config import load_config, validate

    path = tmp_path / "config.yaml"
    path.write_text(block.code, encoding="utf-8")
    validate(load_config(path))


def test_every_block_is_accounted_for() -> None:
    """Every block is run, parsed, shown output, an include, or skipped with a reason; print counts."""
    counts = Counter(_kind(b) for b in ALL_BLOCKS)
    unknown = [b.id for b in ALL_BLOCKS if _kind(b) == "unknown"]
    assert not unknown, f"blocks neither run nor marked: {unknown}"
    for block in ALL_BLOCKS:
        for kind, value in block.markers.items():
            if kind == "test":
                assert value in TEST_MARKERS, f"{block.id}: unknown marker test: {value}"
            if kind == "skip-test":
                assert value.strip(), f"{block.id}: skip-test needs a reason"
    skipped = [f"  {b.id}: {b.markers['skip-test']}" for b in ALL_BLOCKS if _kind(b) == "skipped"]
    print(f"\ndocs code blocks: {dict(sorted(counts.items()))}")
    print("skipped blocks (not run by the tests):", *skipped, sep="\n")
    assert counts["run"] > 0


def test_markers_are_attached_to_blocks() -> None:
    """A marker must sit right above a block (a typo'd or stray marker silently tests nothing)."""
    for page in _pages():
        lines = page.read_text(encoding="utf-8").split("\n")
        for number, line in enumerate(lines):
            if not MARKER.search(line):
                continue
            after = number + 1
            while after < len(lines) and (not lines[after].strip() or MARKER.search(lines[after])):
                after += 1
            assert after < len(lines) and FENCE.match(lines[after]), (
                f"{page.relative_to(REPO)}:{number + 1}: marker not followed by a code block"
            )


# --------------------------------------------------------------------------- facts the pages state

EXAMPLE_PATH = re.compile(r"examples/[\w./-]+\.(?:yaml|py|toml|md)")


def test_every_example_file_named_in_the_docs_exists() -> None:
    for page in _pages():
        for path in set(EXAMPLE_PATH.findall(page.read_text(encoding="utf-8"))):
            assert (REPO / path).is_file(), f"{page.relative_to(REPO)} names {path}, which does not exist"


@pytest.mark.parametrize("path", sorted(p.name for p in (REPO / "examples").glob("*.yaml")))
def test_every_example_config_validates(path: str) -> None:
    """The example training configs the docs point to are valid (names, types, env, agents)."""
    pytest.importorskip("llm_zoo_train.config", reason="the trainer is not installed")
    from llm_zoo_train.config import load_config, validate

    config = load_config(REPO / "examples" / path)
    if config.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip(f"{path} uses the vLLM engine, which is not installed")
    validate(config)


def test_metric_names_in_getting_started_exist_in_the_trainer() -> None:
    """The metrics table of getting-started.md names metrics the trainer's code really writes."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "src" / "llm_zoo_train").rglob("*.py"))
    page = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    rows = [line for line in page.split("\n") if line.startswith("| `") and "/` |" in line]
    assert len(rows) >= 5, "the metrics table of getting-started.md was not found"
    for row in rows:
        names = re.findall(r"`([a-z_]+)`", row.split("|")[2])
        for name in names:
            if name.startswith("_") or "." in name:
                continue
            assert f'"{name}"' in source or f"/{name}" in source or f'{name}"' in source, (
                f"getting-started.md lists the metric {name!r}, which the trainer's code does not write"
            )


def test_troubleshooting_names_real_vllm_options() -> None:
    """The `vllm.*` options troubleshooting.md recommends are fields of the config's vllm section."""
    pytest.importorskip("llm_zoo_train.config", reason="the trainer is not installed")
    import dataclasses

    from llm_zoo_train.config import Config

    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    assert "vllm" in sections, "troubleshooting.md describes a `vllm` config section the code lacks"
    fields = {f.name for f in dataclasses.fields(typing.get_type_hints(Config)["vllm"])}
    named = set(re.findall(r"`vllm\.(\w+)", (DOCS / "troubleshooting.md").read_text(encoding="utf-8")))
    assert named and named <= fields, (
        f"troubleshooting.md names vllm options that do not exist: {named - fields}"
    )


# --------------------------------------------------------------------------- generated pages


def _docgen():
    name = "llm_zoo_docgen"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, DOCS / "_gen" / "docgen.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_docstring_to_markdown_layout() -> None:
    docgen = _docgen()
    doc = (
        "Intro paragraph.\n\nRoles (turn order)\n    ``a`` then ``b``.\n\nRewards\n    Per move::\n\n"
        "        r = -0.01\n\n    then more.\n\nTermination: the episode ends.\n\nVersion history: v0 - first."
    )
    markdown = docgen.docstring_to_markdown(doc)
    assert "## Roles (turn order)\n\n``a`` then ``b``." in markdown
    assert "## Rewards\n\nPer move:\n\n```text\nr = -0.01\n```\n\nthen more." in markdown
    assert "## Termination\n\nThe episode ends." in markdown
    assert "## Version history\n\nv0 - first." in markdown


@pytest.mark.parametrize("env_id", list(_docgen().builtin_envs()))
def test_env_page_has_every_section(env_id: str) -> None:
    page = _docgen().env_page(env_id)
    headings = [line.lstrip("#").strip().lower() for line in page.split("\n") if line.startswith("## ")]
    for needed in (
        "roles",
        "observation",
        "rewards",
        "termination",
        "version history",
        "constructor arguments",
    ):
        assert any(h.startswith(needed) for h in headings), f"{env_id}: no '{needed}' section in {headings}"
    assert "## A first prompt" in page


def test_config_reference_lists_every_field() -> None:
    pytest.importorskip("llm_zoo_train.config", reason="the trainer is not installed")
    import dataclasses
    import typing

    from llm_zoo_train.config import Config

    reference = _docgen().config_reference()
    hints = typing.get_type_hints(Config)
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(hints[section.name]):
            assert f"`{section.name}.{f.name}`" in reference


def test_every_module_has_an_api_page_or_a_reason() -> None:
    docgen = _docgen()
    documented = {module for module, _ in docgen.API_MODULES}
    modules = docgen.python_modules(REPO / "src" / "llm_zoo", "llm_zoo") + docgen.python_modules(
        REPO / "src" / "llm_zoo_train", "llm_zoo_train"
    )
    public = [
        m for m in modules if not any(p.startswith("_") and not p.startswith("__") for p in m.split("."))
    ]
    missing = [m for m in public if m not in documented and m not in docgen.API_EXCLUDED]
    assert not missing, f"modules with neither an API page nor a reason in docs/_gen/docgen.py: {missing}"
    stale = [m for m in documented | set(docgen.API_EXCLUDED) if m not in public]
    assert not stale, f"docs/_gen/docgen.py names modules that do not exist: {stale}"


# --------------------------------------------------------------------------- the site


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict``: no warning (broken link, missing page, bad docstring) passes."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs is not installed (nox -s docs installs it)")
    env = _environment()
    env["NO_MKDOCS_2_WARNING"] = "1"  # Material for MkDocs' banner about its successor
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "WARNING" not in output, output[-6000:]
    for page in ["index.html", "environments/PlanPath-v0/index.html", "training/config/index.html"]:
        assert (tmp_path / "site" / page).is_file(), f"{page} was not built"
