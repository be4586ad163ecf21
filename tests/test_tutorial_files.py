"""The plugin tutorial shows the example plugin's files inline, exactly as they are in the repository.

docs/writing-an-environment.md once showed its code only through ``--8<--`` include lines, so its
raw Markdown (what GitHub and an editor show) had no code. Now each file is written out in a
block captioned ``File `path`:``; this test keeps every such block equal to the file, and every
source file of ``examples/plugin_env`` shown. (tests/test_docs.py runs or parses the blocks.)
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "writing-an-environment.md"
PLUGIN = REPO / "examples" / "plugin_env"
CAPTION = re.compile(r"^File `(?P<path>[^`]+)`:$")
MARKER = re.compile(r"^<!--.*-->$")


def captioned_blocks(text: str) -> dict[str, str]:
    """Path -> body of each fenced block whose caption line (above its markers) names a file."""
    lines = text.split("\n")
    blocks: dict[str, str] = {}
    for number, line in enumerate(lines):
        caption = CAPTION.match(line)
        if not caption:
            continue
        start = number + 1
        while start < len(lines) and (not lines[start].strip() or MARKER.match(lines[start].strip())):
            start += 1
        assert lines[start].startswith("```"), f"caption on line {number + 1} is not followed by a code block"
        end = lines.index("```", start + 1)
        blocks[caption["path"]] = "\n".join(lines[start + 1 : end]) + "\n"
    return blocks


def test_the_tutorial_has_no_include_lines():
    assert "--8<--" not in PAGE.read_text(encoding="utf-8")


def test_every_shown_file_is_the_file_in_the_repository():
    blocks = captioned_blocks(PAGE.read_text(encoding="utf-8"))
    assert blocks, "no captioned file blocks found"
    for path, body in blocks.items():
        assert (REPO / path).read_text(encoding="utf-8") == body, f"the tutorial's copy of {path} is stale"


def test_every_source_file_of_the_example_plugin_is_shown():
    shown = set(captioned_blocks(PAGE.read_text(encoding="utf-8")))
    # what a `pip install examples/plugin_env` leaves behind (build/, *.egg-info) is not a source
    left_by_builds = {"build", "dist", ".eggs", "__pycache__"}
    sources = {
        str(p.relative_to(REPO))
        for p in PLUGIN.rglob("*")
        if p.suffix in {".py", ".toml"}
        and "egg-info" not in str(p)
        and not left_by_builds & set(p.relative_to(PLUGIN).parts)
    }
    assert sources <= shown, f"not shown in the tutorial: {sorted(sources - shown)}"


def test_the_tutorial_names_every_class_attribute_the_base_requires():
    text = PAGE.read_text(encoding="utf-8")
    for attribute in (
        "`roles`",
        '`metadata["name"]`',
        '`metadata["render_modes"]`',
        '`metadata["is_parallelizable"]`',
    ):
        assert attribute in text, attribute
