"""Docker's word processing: quotes, escapes, substitution modifiers, and BuildKit's word splitting."""

from __future__ import annotations

import pytest

from cryobox.image.recipe.shellwords import WordError, expand, name_values, split_words

ENV = {"A": "a", "EMPTY": "", "SP": "x y"}


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("$A", "a"),
        ("${A}", "a"),
        ("pre${A}post", "preapost"),
        ("$A/b", "a/b"),
        ("$UNSET", ""),
        ("${UNSET:-dflt}", "dflt"),
        ("${EMPTY:-dflt}", "dflt"),
        ("${EMPTY-dflt}", ""),
        ("${UNSET-dflt}", "dflt"),
        ("${A:-dflt}", "a"),
        ("${A:+alt}", "alt"),
        ("${EMPTY:+alt}", ""),
        ("${EMPTY+alt}", "alt"),
        ("${UNSET:+alt}", ""),
        ("${UNSET:-$A-x}", "a-x"),
        ("\\$A", "$A"),
        ("'$A'", "$A"),
        ('"$A"', "a"),
        ('"\\$A"', "$A"),
        ('"a\\nb"', "a\\nb"),
        ('"say \\"hi\\""', 'say "hi"'),
        ("a\\ b", "a b"),
        ('"$SP"', "x y"),
        ("$", "$"),
        ("cost $5", "cost "),
    ],
)
def test_expand_as_docker(word: str, expected: str) -> None:
    assert expand(word, ENV) == expected


def test_backtick_escape() -> None:
    assert expand("`$A", ENV, escape="`") == "$A"
    assert expand("\\$A", ENV, escape="`") == "\\a"


@pytest.mark.parametrize("word", ["'open", '"open', "${A", "${}", "${A#x}", "${A%x}", "${A/x/y}", "${UNSET:?must}"])
def test_refused_words(word: str) -> None:
    with pytest.raises(WordError):
        expand(word, ENV)


def test_required_variable_message() -> None:
    with pytest.raises(WordError, match="UNSET: must be set"):
        expand("${UNSET?must be set}", ENV)
    assert expand("${EMPTY?x}", ENV) == ""


def test_split_words_keeps_quotes() -> None:
    assert split_words("a=1 b=\"x y\" c='q r'  d\\ e") == ["a=1", 'b="x y"', "c='q r'", "d\\ e"]
    assert split_words('x=""') == ['x=""']


def test_name_values_both_forms() -> None:
    assert name_values("K some value", "ENV") == [("K", "some value")]
    assert name_values('K=v K2="v 2"', "ENV") == [("K", "v"), ("K2", '"v 2"')]
    with pytest.raises(WordError):
        name_values("K=v bare", "ENV")
    with pytest.raises(WordError):
        name_values("K", "ENV")
