"""Reading a Dockerfile's lines: directives, comments, continuations, keywords and options."""

from __future__ import annotations

import pytest

from cryobox.errors import InvalidArgument
from cryobox.image.recipe.dflines import read_instructions


def test_continuations_comments_and_line_numbers() -> None:
    doc = read_instructions(
        "# a comment\n"
        "\n"
        "from debian:12\n"
        "RUN apt-get update && \\\n"
        "    # a comment inside\n"
        "\n"
        "    apt-get install -y curl\n"
        "  run echo # not a comment\n"
    )
    assert [(i.keyword, i.line, i.rest) for i in doc.instructions] == [
        ("FROM", 3, "debian:12"),
        ("RUN", 4, "apt-get update &&     apt-get install -y curl"),
        ("RUN", 8, "echo # not a comment"),
    ]


def test_escape_directive_backtick() -> None:
    doc = read_instructions("# escape=`\nFROM x\nRUN a `\n  b\n")
    assert doc.escape == "`"
    assert doc.instructions[1].rest == "a   b"


def test_directives_only_at_top() -> None:
    doc = read_instructions("FROM x\n# escape=`\nRUN a \\\n b\n")
    assert doc.escape == "\\"
    assert doc.instructions[1].rest == "a  b"


@pytest.mark.parametrize(
    "syntax", ["docker/dockerfile:1", "docker/dockerfile:1.7", "docker.io/docker/dockerfile:1.7.1"]
)
def test_syntax_accepted(syntax: str) -> None:
    assert read_instructions(f"# syntax={syntax}\nFROM x\n").instructions[0].keyword == "FROM"


@pytest.mark.parametrize(
    "text",
    [
        "# syntax=docker/dockerfile:1-labs\nFROM x\n",
        "# syntax=example.com/frontend:1\nFROM x\n",
        "# escape=x\nFROM x\n",
        "# escape=\\\n# escape=`\nFROM x\n",
    ],
)
def test_bad_directives(text: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        read_instructions(text)
    assert info.value.details["line"] in (1, 2)


def test_flags_and_json() -> None:
    doc = read_instructions('COPY --chown=a:b --link --chmod="0755" ["a b", "/x/"]\n')
    ins = doc.instructions[0]
    assert ins.flags == {"chown": "a:b", "link": "", "chmod": "0755"}
    assert ins.json_args() == ["a b", "/x/"]
    assert read_instructions("RUN [not json\n").instructions[0].json_args() is None


def test_crlf_and_bom() -> None:
    doc = read_instructions("\ufeffFROM x\r\nRUN a \\\r\n b\r\n")
    assert [i.rest for i in doc.instructions] == ["x", "a  b"]
