import random
import re

import pytest

from llm_zoo.parsing import (
    ParseError,
    extract_boxed,
    extract_code_block,
    extract_marked_list,
    extract_moves,
    iter_fenced_blocks,
)


def test_code_block_prefers_last_python_block():
    text = "```\nuntagged\n```\n```python\nfirst\n```\nprose\n```python\nprint(2)\n```\n```bash\nls\n```"
    assert extract_code_block(text) == "print(2)\n"


def test_code_block_falls_back_to_untagged():
    assert extract_code_block("here:\n```\nprint(1)\n```") == "print(1)\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no code here", "no code block"),
        ("```python\nprint(1)\n", "no complete code block"),
        ("```python\n   \n```", "empty"),
    ],
)
def test_code_block_errors_explain(text, message):
    with pytest.raises(ParseError, match=message):
        extract_code_block(text)


def test_marked_list_takes_the_last_marker():
    assert extract_marked_list('#### ["U"] then #### ["D", "L"] done', "####") == ["D", "L"]


def test_marked_list_never_evaluates_code():
    with pytest.raises(ParseError, match="not a valid list literal"):
        extract_marked_list("#### [__import__('os').system('echo hi')]", "####")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("the answer", "no `####` found"),
        ("#### U, R", "followed by a list"),
        ('#### ["U", ', "not closed"),
        ("#### [[[]", "not closed"),
    ],
)
def test_marked_list_errors(text, message):
    with pytest.raises(ParseError, match=message):
        extract_marked_list(text, "####")


def test_marked_list_refuses_huge_lists():
    with pytest.raises(ParseError, match="longer than"):
        extract_marked_list("#### [" + "1," * 20_000 + "]", "####")


def test_moves_accept_case_and_words():
    assert extract_moves('#### ["u", "Right", " D ", "left"]', "####") == ["U", "R", "D", "L"]


def test_moves_reject_unknown_token_by_position():
    with pytest.raises(ParseError, match='move 2 is "X"'.replace('"', "'")):
        extract_moves('#### ["U", "X"]', "####")
    with pytest.raises(ParseError, match="move 1 is 3"):
        extract_moves("#### [3]", "####")


def test_moves_cap():
    with pytest.raises(ParseError, match="too many moves"):
        extract_moves("#### " + str(["U"] * 11), "####", max_moves=10)


def test_boxed_balanced_braces_and_last_one():
    assert extract_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert extract_boxed(r"\fbox{ 7 }") == "7"


@pytest.mark.parametrize(
    ("text", "message"),
    [("42", "no \\\\boxed"), (r"\boxed{}", "empty"), (r"\boxed{\frac{1}{2}", "not closed")],
)
def test_boxed_errors(text, message):
    with pytest.raises(ParseError, match=message):
        extract_boxed(text)


# The regexes the linear scanners replaced: kept here as the oracle of the intended behaviour.
_REGEX_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+\-]*)[^\n]*\n(.*?)```", re.DOTALL)
_REGEX_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _outcome(function, text):
    try:
        return "value", function(text)
    except ParseError as err:
        return "error", str(err)


def _regex_extract_boxed(text: str) -> str:
    """The former ``extract_boxed``: the last regex match, then balanced braces."""
    starts = [m.end() for m in _REGEX_BOX.finditer(text)]
    if not starts:
        raise ParseError("no \\boxed{...} found: end your answer with \\boxed{your final answer}")
    depth = 1
    for index in range(starts[-1], len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            content = text[starts[-1] : index].strip()
            if not content:
                raise ParseError("the \\boxed{} is empty")
            return content
    raise ParseError("the last \\boxed{ is not closed with a matching }")


@pytest.mark.parametrize(
    ("text", "blocks"),
    [
        ("```python\nprint(1)```", [("python", "print(1)")]),
        ("``` \t py3 extra words\nx\n```", [("py3", "x\n")]),
        ("````\ncode\n````", [("", "code\n")]),
        ("```python ```\nbody```", [("python", "body")]),
        ("```a\n```b\nc```", [("a", "")]),
        ("```\n```\n```\n", [("", "")]),
        ("`` ```x", []),
        ("```python\nno closer", []),
    ],
)
def test_fenced_blocks_edge_cases(text, blocks):
    assert list(iter_fenced_blocks(text)) == blocks
    assert [m.groups() for m in _REGEX_FENCE.finditer(text)] == blocks


def test_scanners_agree_with_the_regexes_they_replaced_on_random_text():
    pieces = ["`", "```", "```python", "```json", "``` py", "\n", " ", "\t", "x", "\\boxed", "\\fbox",
              "{", "}", "\\boxed{", "\u00a0", "\r", "-"]  # fmt: skip
    rng = random.Random(13)
    for _ in range(5000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 24)))
        assert list(iter_fenced_blocks(text)) == [m.groups() for m in _REGEX_FENCE.finditer(text)], text
        assert _outcome(extract_boxed, text) == _outcome(_regex_extract_boxed, text), text
