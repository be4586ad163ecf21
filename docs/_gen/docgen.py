"""Pages generated from the code at build time, so they cannot drift from it.

Used by the MkDocs hooks (``docs/_gen/hooks.py``) and by ``tests/test_docs.py``:

* :func:`env_page` - one page per built-in environment, made from its module docstring (roles,
  observation, actions, rewards, termination, version history), the docstrings of the shared
  modules it builds on and of the data modules it loads problems from, its constructor arguments
  (signature defaults + ``Args:`` docs), and the first prompt it really produces.
* :func:`env_table` - the table of every built-in environment.
* :func:`config_reference` - every training configuration field: name, type, default, docstring,
  from the dataclasses in ``llm_zoo_train/config/sections.py``.
* :data:`API_MODULES` - the modules with an API reference page (mkdocstrings renders them).

The environment module docstrings use a small reStructuredText-like layout (definition lists,
``::`` literal blocks, ``:func:`` roles); :func:`docstring_to_markdown` turns it into Markdown.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import importlib
import inspect
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

#: Modules with an API reference page, in navigation order: (module, page title).
API_MODULES: list[tuple[str, str]] = [
    ("llm_zoo", "llm_zoo"),
    ("llm_zoo.core", "llm_zoo.core"),
    ("llm_zoo.registry", "llm_zoo.registry"),
    ("llm_zoo.arguments", "llm_zoo.arguments"),
    ("llm_zoo.testing", "llm_zoo.testing"),
    ("llm_zoo.family", "llm_zoo.family"),
    ("llm_zoo.integrations.trl", "llm_zoo.integrations.trl"),
    ("llm_zoo.reward_hacks", "llm_zoo.reward_hacks"),
    ("llm_zoo.reward_hacks.policies", "llm_zoo.reward_hacks.policies"),
    ("llm_zoo.reward_hacks.search", "llm_zoo.reward_hacks.search"),
    ("llm_zoo.parsing", "llm_zoo.parsing"),
    ("llm_zoo.sandbox", "llm_zoo.sandbox"),
    ("llm_zoo.checkers.call_harness", "llm_zoo.checkers.call_harness"),
    ("llm_zoo.checkers.call_checker", "llm_zoo.checkers.call_checker"),
    ("llm_zoo.checkers.math_check", "llm_zoo.checkers.math_check"),
    ("llm_zoo.checkers.math_workers", "llm_zoo.checkers.math_workers"),
    ("llm_zoo.checkers.math_normalize", "llm_zoo.checkers.math_normalize"),
    ("llm_zoo.checkers.math_strict", "llm_zoo.checkers.math_strict"),
    ("llm_zoo.cli", "llm_zoo.cli"),
    ("llm_zoo.serve", "llm_zoo.serve"),
    ("llm_zoo.serve.app", "llm_zoo.serve.app"),
    ("llm_zoo.serve.protocol", "llm_zoo.serve.protocol"),
    ("llm_zoo.serve.sessions", "llm_zoo.serve.sessions"),
    ("llm_zoo.serve.run", "llm_zoo.serve.run"),
    ("llm_zoo.serve.auth", "llm_zoo.serve.auth"),
    ("llm_zoo.serve.arguments", "llm_zoo.serve.arguments"),
    ("llm_zoo.serve.limits", "llm_zoo.serve.limits"),
    ("llm_zoo.safe_ast", "llm_zoo.safe_ast"),
    ("llm_zoo.remote", "llm_zoo.remote"),
    ("llm_zoo.envs.plan_path", "llm_zoo.envs.plan_path"),
    ("llm_zoo.envs.sokoban", "llm_zoo.envs.sokoban"),
    ("llm_zoo.envs.grid_agents", "llm_zoo.envs.grid_agents"),
    ("llm_zoo.envs.grid_answers", "llm_zoo.envs.grid_answers"),
    ("llm_zoo.envs.code", "llm_zoo.envs.code"),
    ("llm_zoo.envs.code_judge", "llm_zoo.envs.code_judge"),
    ("llm_zoo.envs.code_tester_reward", "llm_zoo.envs.code_tester_reward"),
    ("llm_zoo.envs.code_prompts", "llm_zoo.envs.code_prompts"),
    ("llm_zoo.envs.code_impossible", "llm_zoo.envs.code_impossible"),
    ("llm_zoo.envs.code_mutants", "llm_zoo.envs.code_mutants"),
    ("llm_zoo.envs.math", "llm_zoo.envs.math"),
    ("llm_zoo.envs.math_options", "llm_zoo.envs.math_options"),
    ("llm_zoo.envs.math_relay", "llm_zoo.envs.math_relay"),
    ("llm_zoo.envs.key_relay", "llm_zoo.envs.key_relay"),
    ("llm_zoo.data.code", "llm_zoo.data.code"),
    ("llm_zoo.data.code_problem", "llm_zoo.data.code_problem"),
    ("llm_zoo.data.code_formats", "llm_zoo.data.code_formats"),
    ("llm_zoo.data.code_call_formats", "llm_zoo.data.code_call_formats"),
    ("llm_zoo.data.files", "llm_zoo.data.files"),
    ("llm_zoo.data.saved_dataset", "llm_zoo.data.saved_dataset"),
    ("llm_zoo.data.math", "llm_zoo.data.math"),
    ("llm_zoo.data.math_fields", "llm_zoo.data.math_fields"),
    ("llm_zoo.data.math_generator", "llm_zoo.data.math_generator"),
    ("llm_zoo_train.config", "llm_zoo_train.config"),
    ("llm_zoo_train.config.sections", "llm_zoo_train.config.sections"),
    ("llm_zoo_train.config.loading", "llm_zoo_train.config.loading"),
    ("llm_zoo_train.config.typed", "llm_zoo_train.config.typed"),
    ("llm_zoo_train.config.aliases", "llm_zoo_train.config.aliases"),
    ("llm_zoo_train.config.checks", "llm_zoo_train.config.checks"),
    ("llm_zoo_train.config.base_models", "llm_zoo_train.config.base_models"),
    ("llm_zoo_train.config.agent_plan", "llm_zoo_train.config.agent_plan"),
    ("llm_zoo_train.config.agent_sampling", "llm_zoo_train.config.agent_sampling"),
    ("llm_zoo_train.runs.seeding", "llm_zoo_train.runs.seeding"),
    ("llm_zoo_train.runs.checkpoint", "llm_zoo_train.runs.checkpoint"),
    ("llm_zoo_train.runs.run_dir", "llm_zoo_train.runs.run_dir"),
    ("llm_zoo_train.runs.manifest", "llm_zoo_train.runs.manifest"),
    ("llm_zoo_train.runs.lock", "llm_zoo_train.runs.lock"),
    ("llm_zoo_train.runs.base_fingerprint", "llm_zoo_train.runs.base_fingerprint"),
    ("llm_zoo_train.runs.interrupts", "llm_zoo_train.runs.interrupts"),
    ("llm_zoo_train.runs.finite", "llm_zoo_train.runs.finite"),
    ("llm_zoo_train.runs.sharded_state", "llm_zoo_train.runs.sharded_state"),
    ("llm_zoo_train.runs.launch_check", "llm_zoo_train.runs.launch_check"),
    ("llm_zoo_train.runs.threads", "llm_zoo_train.runs.threads"),
    ("llm_zoo_train.runs.memory", "llm_zoo_train.runs.memory"),
    ("llm_zoo_train.models.policy", "llm_zoo_train.models.policy"),
    ("llm_zoo_train.models.sharding", "llm_zoo_train.models.sharding"),
    ("llm_zoo_train.models.chat", "llm_zoo_train.models.chat"),
    ("llm_zoo_train.kernels", "llm_zoo_train.kernels"),
    ("llm_zoo_train.kernels.precision", "llm_zoo_train.kernels.precision"),
    ("llm_zoo_train.kernels.attention", "llm_zoo_train.kernels.attention"),
    ("llm_zoo_train.kernels.update_attention", "llm_zoo_train.kernels.update_attention"),
    ("llm_zoo_train.kernels.attention_choices", "llm_zoo_train.kernels.attention_choices"),
    ("llm_zoo_train.kernels.lora_forward", "llm_zoo_train.kernels.lora_forward"),
    ("llm_zoo_train.kernels.lora_inference", "llm_zoo_train.kernels.lora_inference"),
    ("llm_zoo_train.kernels.lora_training", "llm_zoo_train.kernels.lora_training"),
    ("llm_zoo_train.kernels.lora_rank_rows", "llm_zoo_train.kernels.lora_rank_rows"),
    ("llm_zoo_train.kernels.packed_linear", "llm_zoo_train.kernels.packed_linear"),
    ("llm_zoo_train.kernels.merged_lora", "llm_zoo_train.kernels.merged_lora"),
    ("llm_zoo_train.kernels.rollout_activations", "llm_zoo_train.kernels.rollout_activations"),
    ("llm_zoo_train.kernels.frozen_linear", "llm_zoo_train.kernels.frozen_linear"),
    ("llm_zoo_train.kernels.choices", "llm_zoo_train.kernels.choices"),
    ("llm_zoo_train.engines.base", "llm_zoo_train.engines.base"),
    ("llm_zoo_train.engines.hf", "llm_zoo_train.engines.hf"),
    ("llm_zoo_train.engines.hf.engine", "llm_zoo_train.engines.hf.engine"),
    ("llm_zoo_train.engines.hf.decode", "llm_zoo_train.engines.hf.decode"),
    ("llm_zoo_train.engines.hf.prefill", "llm_zoo_train.engines.hf.prefill"),
    ("llm_zoo_train.engines.hf.prefix_cache", "llm_zoo_train.engines.hf.prefix_cache"),
    ("llm_zoo_train.engines.hf.kv_buffer", "llm_zoo_train.engines.hf.kv_buffer"),
    ("llm_zoo_train.engines.hf.reading", "llm_zoo_train.engines.hf.reading"),
    ("llm_zoo_train.engines.vllm", "llm_zoo_train.engines.vllm"),
    ("llm_zoo_train.engines.vllm.engine", "llm_zoo_train.engines.vllm.engine"),
    ("llm_zoo_train.engines.vllm.requests", "llm_zoo_train.engines.vllm.requests"),
    ("llm_zoo_train.engines.vllm.server", "llm_zoo_train.engines.vllm.server"),
    ("llm_zoo_train.engines.vllm.server_launch", "llm_zoo_train.engines.vllm.server_launch"),
    ("llm_zoo_train.engines.vllm.server_client", "llm_zoo_train.engines.vllm.server_client"),
    ("llm_zoo_train.engines.vllm.server_checks", "llm_zoo_train.engines.vllm.server_checks"),
    ("llm_zoo_train.engines.vllm.placement", "llm_zoo_train.engines.vllm.placement"),
    ("llm_zoo_train.engines.openai_compat", "llm_zoo_train.engines.openai_compat"),
    ("llm_zoo_train.rollout.step", "llm_zoo_train.rollout.step"),
    ("llm_zoo_train.rollout.asynchronous", "llm_zoo_train.rollout.asynchronous"),
    ("llm_zoo_train.rollout.worker", "llm_zoo_train.rollout.worker"),
    ("llm_zoo_train.rollout.tree", "llm_zoo_train.rollout.tree"),
    ("llm_zoo_train.rollout.team_credit", "llm_zoo_train.rollout.team_credit"),
    ("llm_zoo_train.rollout.env_play", "llm_zoo_train.rollout.env_play"),
    ("llm_zoo_train.rollout.env_servers", "llm_zoo_train.rollout.env_servers"),
    ("llm_zoo_train.rollout.samples", "llm_zoo_train.rollout.samples"),
    ("llm_zoo_train.rollout.replay", "llm_zoo_train.rollout.replay"),
    ("llm_zoo_train.training.model_pools", "llm_zoo_train.training.model_pools"),
    ("llm_zoo_train.training.update", "llm_zoo_train.training.update"),
    ("llm_zoo_train.training.advantages", "llm_zoo_train.training.advantages"),
    ("llm_zoo_train.training.loss", "llm_zoo_train.training.loss"),
    ("llm_zoo_train.training.token_logprobs", "llm_zoo_train.training.token_logprobs"),
    ("llm_zoo_train.reporting.model_card", "llm_zoo_train.reporting.model_card"),
    ("llm_zoo_train.reporting.update_progress", "llm_zoo_train.reporting.update_progress"),
    ("llm_zoo_train.reporting.tracking", "llm_zoo_train.reporting.tracking"),
    ("llm_zoo_train.reporting.progress", "llm_zoo_train.reporting.progress"),
    ("llm_zoo_train.evaluation.evaluate", "llm_zoo_train.evaluation.evaluate"),
    ("llm_zoo_train.evaluation.majority", "llm_zoo_train.evaluation.majority"),
    ("llm_zoo_train.evaluation.cli", "llm_zoo_train.evaluation.cli"),
    ("llm_zoo_train.evaluation.plan", "llm_zoo_train.evaluation.plan"),
    ("llm_zoo_train.evaluation.tasks", "llm_zoo_train.evaluation.tasks"),
    ("llm_zoo_train.evaluation.paired", "llm_zoo_train.evaluation.paired"),
    ("llm_zoo_train.evaluation.defaults", "llm_zoo_train.evaluation.defaults"),
    ("llm_zoo_train.trainer", "llm_zoo_train.trainer"),
    ("llm_zoo_train.trainer_setup", "llm_zoo_train.trainer_setup"),
    ("llm_zoo_train.trainer_state", "llm_zoo_train.trainer_state"),
]

#: Modules deliberately without an API page (besides private ``_name`` modules, never documented).
API_EXCLUDED: dict[str, str] = {
    "llm_zoo.envs": "registration of the built-in envs only",
    **{
        f"llm_zoo.envs.{name}_v0": "a PettingZoo family module (llm_zoo.family documents all of them)"
        for name in ("plan_path", "sokoban", "code", "math", "math_relay", "key_relay")
    },
    "llm_zoo.data": "package marker",
    "llm_zoo.integrations": "package marker",
    "llm_zoo_train": "package marker",
    "llm_zoo_train.__main__": "the command line, documented on the Training page",
    "llm_zoo_train.engines": "package marker",
    "llm_zoo_train.runs": "stage package: its docstring names the stage (docs/training/architecture.md)",
    "llm_zoo_train.models": "stage package: its docstring names the stage (docs/training/architecture.md)",
    "llm_zoo_train.rollout": "stage package: its docstring names the stage (docs/training/architecture.md)",
    "llm_zoo_train.training": "stage package: its docstring names the stage (docs/training/architecture.md)",
    "llm_zoo_train.reporting": "stage package: its docstring names the stage (docs/training/architecture.md)",
    "llm_zoo_train.evaluation": "stage package: its docstring names the stage (docs/training/architecture.md)",
    "llm_zoo.checkers": "package marker",
    "llm_zoo.sandbox.cgroup": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
    "llm_zoo.sandbox.cancel": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
    "llm_zoo.sandbox.cleanup": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
    "llm_zoo.sandbox.jail": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
    "llm_zoo.sandbox.layers": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
    "llm_zoo.sandbox.pool": "the implementation of llm_zoo.sandbox's public API, re-exported and documented there",
    "llm_zoo.sandbox.protocol": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
    "llm_zoo.sandbox.runner": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
    "llm_zoo.sandbox.seccomp": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
    "llm_zoo.sandbox.server": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
    "llm_zoo.sandbox.view": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
    "llm_zoo.sandbox.worker": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
    "llm_zoo.sandbox.zygote": "the sandbox's internals; llm_zoo.sandbox documents how it isolates programs",
}


def api_page_path(module: str) -> str:
    return f"api/{module}.md"


def api_page(module: str) -> str:
    # The module's own heading (h1) is the page title and the anchor cross-references point to.
    return f"::: {module}\n    options:\n      show_root_heading: true\n      heading_level: 1\n"


def python_modules(package_dir: Path, package: str) -> list[str]:
    """Every module of a source package (for the test that no module lacks a decision)."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append(".".join([package, *parts]))
    return found


# --------------------------------------------------------------------------- docstring -> Markdown

_ROLE = re.compile(r":(?:mod|func|class|meth|data|attr|exc|obj):`(~?)([^`]+)`")
_LIST_ITEM = re.compile(r"^\s*(?:[*+-]|\d+[.)])\s")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _fence_for(text: str) -> str:
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _literal_blocks(lines: list[str]) -> list[str]:
    """``paragraph::`` + an indented block -> ``paragraph:`` + a fenced ``text`` block."""
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.rstrip().endswith("::"):
            out.append(line)
            index += 1
            continue
        head = line.rstrip()[:-2].rstrip()
        base = _indent(line)
        if head.strip():
            out.append(head + ":")
        index += 1
        block: list[str] = []
        while index < len(lines) and (not lines[index].strip() or _indent(lines[index]) > base):
            block.append(lines[index])
            index += 1
        while block and not block[-1].strip():
            block.pop()
        body = textwrap.dedent("\n".join(block)).strip("\n")
        fence = _fence_for(body)
        pad = " " * base
        out += [
            "",
            f"{pad}{fence}text",
            *(pad + b if b else "" for b in body.split("\n")),
            f"{pad}{fence}",
            "",
        ]
    return out


def _is_term(lines: list[str], index: int) -> bool:
    """A definition-list term: a top-level line, not a list item, whose next line is indented >= 4."""
    line = lines[index]
    if not line.strip() or _indent(line) or _LIST_ITEM.match(line) or line.rstrip().endswith(":"):
        return False
    if index > 0 and lines[index - 1].strip():
        return False
    following = lines[index + 1] if index + 1 < len(lines) else ""
    return bool(following.strip()) and _indent(following) >= 4


#: Paragraphs that open with one of these words start a section of an env's documentation.
SECTION_NAMES = (
    "Roles", "Observations", "Observation", "Actions", "Action", "Rewards", "Termination",
    "Judging", "Test validity", "Problems", "Datasets", "Infos", "Options", "Level", "Version history",
)  # fmt: skip
_SECTION_LEAD = re.compile(rf"^(?P<name>{'|'.join(SECTION_NAMES)})(?P<sep>:|,| \(|\.)")

_TITLE_LINE = re.compile(r"^(?P<title>[A-Z][A-Za-z ,/'-]{0,40}?)(?:\s*\((?P<note>.+)\))?:$")


def docstring_to_markdown(doc: str, level: int = 2) -> str:
    """Turn an llm-zoo module docstring (without its summary line) into Markdown.

    * ``Term`` + an indented body (a definition list) -> a heading ``Term`` and the body;
    * a top-level line ``Title:`` or ``Title (note):`` between blank lines -> a heading (and the
      note as a paragraph);
    * ``Version history: text`` -> a heading and the text;
    * ``text::`` + an indented block -> ``text:`` + a fenced ``text`` block.

    ``:func:`x``` roles are left for the HTML hook, which turns them into links where it can.
    """
    hashes = "#" * level
    lines = textwrap.dedent(doc).strip("\n").split("\n")
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        previous_blank = index == 0 or not lines[index - 1].strip()
        next_blank = index + 1 >= len(lines) or not lines[index + 1].strip()
        if _is_term(lines, index):
            out += [f"{hashes} {line.strip()}", ""]
            index += 1
            body = []
            while index < len(lines) and (not lines[index].strip() or _indent(lines[index]) >= 4):
                body.append(lines[index])
                index += 1
            out += _literal_blocks(textwrap.dedent("\n".join(body)).strip("\n").split("\n"))
            out.append("")
            continue
        title = _TITLE_LINE.match(line)
        if title and len(title["title"].split()) <= 4 and previous_blank and next_blank and not _indent(line):
            out += [f"{hashes} {title['title']}", ""]
            if title["note"]:
                out += [title["note"][0].upper() + title["note"][1:] + ".", ""]
            index += 1
            continue
        keyword = _SECTION_LEAD.match(line)
        if keyword and previous_blank and not _indent(line):
            out += [f"{hashes} {keyword['name']}", ""]
            rest = line[keyword.end() :]
            if keyword["sep"] == ":" and rest.strip():  # "Termination: the episode..." -> "The episode..."
                line = rest.strip()
                if not re.match(r"v\d", line):  # "Version history: v0 ..." stays as it is
                    line = line[0].upper() + line[1:]
            elif keyword["sep"] == ":" and not rest.strip():
                index += 1
                continue
            out.append(line)
            index += 1
            continue
        out.append(line)
        index += 1
    text = "\n".join(_literal_blocks(out))
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def split_summary(doc: str) -> tuple[str, str]:
    """(first paragraph joined into one line, the rest)."""
    doc = inspect.cleandoc(doc)
    head, _, rest = doc.partition("\n\n")
    return " ".join(head.split()), rest


# --------------------------------------------------------------------------- environments


def builtin_envs() -> dict[str, tuple[str, str]]:
    from llm_zoo.envs import BUILTIN_ENVS

    return dict(BUILTIN_ENVS)


def env_page_path(env_id: str) -> str:
    return f"environments/{env_id}.md"


def parse_args_section(doc: str | None) -> dict[str, str]:
    """The ``Args:`` section of a Google-style docstring: {name: description (one line)}."""
    if not doc:
        return {}
    lines = inspect.cleandoc(doc).split("\n")
    args: dict[str, str] = {}
    inside, current, item_indent, base = False, None, None, 0
    for line in lines:
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            inside, current, item_indent, base = True, None, None, _indent(line)
            continue
        if not inside or not line.strip():
            continue
        if _indent(line) <= base:
            inside = False  # the next section
            continue
        if item_indent is None:
            item_indent = _indent(line)
        match = re.match(r"^\s*\*{0,2}([A-Za-z_]\w*)\s*(?:\([^)]*\))?:\s*(.*)$", line)
        if match and _indent(line) == item_indent:
            current = match[1]
            args[current] = match[2].strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}"
    return args


def _mro_args(cls: type) -> dict[str, str]:
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        docs.update(parse_args_section(klass.__doc__))
    return docs


def _md_cell(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes escaped outside code spans (Python-Markdown
    keeps the pipes of a code span, and would show the backslash of an escaped one)."""
    parts = re.split(r"(`+[^`]*`+)", text.replace("\n", " "))
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def _rst_inline(text: str) -> str:
    """``code`` (RST) is valid Markdown already; roles become plain code spans in tables."""
    return _ROLE.sub(lambda m: f"`{m[2].split('.')[-1] if m[1] else m[2]}`", text)


def constructor_table(cls: type) -> str:
    signature = inspect.signature(cls)
    docs = _mro_args(cls)
    rows = ["| Argument | Default | Description |", "|---|---|---|"]
    for name, parameter in signature.parameters.items():
        if parameter.kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
            continue
        default = "required" if parameter.default is inspect.Parameter.empty else f"`{parameter.default!r}`"
        rows.append(f"| `{name}` | {_md_cell(default)} | {_md_cell(_rst_inline(docs.get(name, '')))} |")
    return "\n".join(rows)


def _module_docstring(module: str) -> str:
    return inspect.getdoc(importlib.import_module(module)) or ""


def _imported_modules(module: str, prefix: str) -> list[str]:
    """Modules under ``prefix`` imported by ``module``'s source, recursively, in import order."""
    seen: list[str] = []

    def visit(name: str) -> None:
        path = inspect.getsourcefile(importlib.import_module(name))
        tree = ast.parse(Path(path or "").read_text(encoding="utf-8"))
        for node in tree.body:
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets.append(node.module)
                targets += [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            for target in targets:
                if target.startswith(prefix) and target not in seen and target != name:
                    try:
                        imported = importlib.import_module(target)
                    except ImportError:
                        continue  # a name imported from a module, not a module
                    if hasattr(imported, "__path__"):
                        continue  # a package: its modules are what matters
                    seen.append(target)
                    visit(target)

    visit(module)
    return seen


def _shared_env_modules(cls: type) -> list[str]:
    """Modules of ``llm_zoo.envs`` that define base classes of ``cls`` (e.g. grid_agents)."""
    from llm_zoo.core import TextAECEnv

    modules = []
    for klass in cls.__mro__[1:]:
        if klass is TextAECEnv or not issubclass(klass, TextAECEnv):
            continue
        if klass.__module__.startswith("llm_zoo.envs.") and klass.__module__ != cls.__module__:
            modules.append(klass.__module__)
    return list(dict.fromkeys(modules))


def _first_prompt(env_id: str) -> tuple[str, str]:
    import llm_zoo

    env = llm_zoo.make(env_id)
    try:
        env.reset(seed=0)
        agent = env.agent_selection
        return agent, env.observe(agent)["prompt"]
    finally:
        env.close()


def env_page(env_id: str) -> str:
    """The Markdown page of one built-in environment."""
    import llm_zoo

    env_spec = llm_zoo.spec(env_id)
    cls = env_spec.load()
    module = cls.__module__
    summary, body = split_summary(_module_docstring(module))
    summary = re.sub(rf"^{re.escape(env_id)}:\s*", "", summary)
    roles = ", ".join(f"`{r}`" for r in cls.roles)
    entry = env_spec.entry_point if isinstance(env_spec.entry_point, str) else repr(env_spec.entry_point)
    parts = [
        f"# {env_id}",
        "",
        "<!-- Generated at build time by docs/_gen/docgen.py from the code: edit the docstrings, not this page. -->",
        "",
        f"{summary[0].upper()}{summary[1:]}",
        "",
        "| | |",
        "|---|---|",
        f"| Agents, in turn order | {roles} |",
        f"| Class | `{entry}` |",
        f'| Make it | `llm_zoo.make("{env_id}", **kwargs)` |',
        f"| Play it | `llm-zoo play {env_id} --seed 0` |",
        f"| Check it | `llm-zoo check {env_id}` |",
        "",
        docstring_to_markdown(body),
        "## Constructor arguments",
        "",
        "Pass them to `llm_zoo.make` (or as `--env-arg name=value` to `llm-zoo play`, or under "
        "`env.kwargs` in a training config). Every environment also takes the common arguments of "
        "[`TextAECEnv`][llm_zoo.core.TextAECEnv].",
        "",
        constructor_table(cls),
        "",
    ]
    for shared in _shared_env_modules(cls):
        shared_summary, shared_body = split_summary(_module_docstring(shared))
        parts += [
            f"## Shared mechanics (`{shared}`)",
            "",
            shared_summary,
            "",
            docstring_to_markdown(shared_body, level=3),
        ]
    for data_module in _imported_modules(module, "llm_zoo.data"):
        data_summary, data_body = split_summary(_module_docstring(data_module))
        parts += [
            f"## Datasets: `{data_module}`",
            "",
            data_summary,
            "",
            docstring_to_markdown(data_body, level=3),
        ]
    agent, prompt = _first_prompt(env_id)
    fence = _fence_for(prompt)
    parts += [
        "## A first prompt",
        "",
        f"What `{agent}` reads first, exactly as the env produces it at build time "
        f'(`llm_zoo.make("{env_id}")`, `reset(seed=0)`):',
        "",
        f'??? example "The first prompt of `{agent}`"',
        "",
        textwrap.indent(f"{fence}text\n{prompt}\n{fence}", "    "),
        "",
    ]
    return "\n".join(parts)


def env_table() -> str:
    """A table of every built-in environment with its agents and one-line description."""
    import llm_zoo

    rows = ["| Environment | Agents, in turn order | What it is |", "|---|---|---|"]
    for env_id, (_, description) in builtin_envs().items():
        cls = llm_zoo.spec(env_id).load()
        roles = ", ".join(f"`{r}`" for r in cls.roles)
        rows.append(f"| [{env_id}]({env_id}.md) | {roles} | {_md_cell(description)} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- training configuration


def _default_text(f: dataclasses.Field[Any]) -> str:
    import yaml

    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    text = text.removesuffix("...").strip()
    return f"`{text}`"


def type_name(annotation: Any) -> str:
    """A YAML-minded name of a field's type: ``int``, ``str | null``, ``tree | independent``, ..."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return "any"
    if annotation is type(None):
        return "null"
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin in (list, collections.abc.Sequence):
        return f"list[{type_name(args[0])}]"
    if origin in (dict, collections.abc.Mapping):
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]"
    return getattr(annotation, "__name__", str(annotation))


def config_reference() -> str:
    """Every section and field of the training config, from ``llm_zoo_train.config``."""
    from llm_zoo_train.config import Config, field_docs

    hints = typing.get_type_hints(Config)
    section_docs = field_docs(Config)
    parts = []
    for section in dataclasses.fields(Config):
        cls = hints[section.name]
        docs = field_docs(cls)
        field_hints = typing.get_type_hints(cls)
        parts += [
            f"### `{section.name}`",
            "",
            f"{section_docs.get(section.name, '')} (`{cls.__name__}`)",
            "",
            "| Field | Type | Default | Description |",
            "|---|---|---|---|",
        ]
        for f in dataclasses.fields(cls):
            parts.append(
                f"| `{section.name}.{f.name}` | {_md_cell(f'`{type_name(field_hints[f.name])}`')} "
                f"| {_md_cell(_default_text(f))} | {_md_cell(docs.get(f.name, ''))} |"
            )
        parts.append("")
    return "\n".join(parts)


#: ``<!-- generate: NAME -->`` placeholders in the hand-written pages.
PLACEHOLDERS = {
    "env-table": env_table,
    "config-reference": config_reference,
}
