import pytest

from llm_zoo.parsing import ParseError, extract_boxed, extract_code_block, extract_marked_list, extract_moves


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
