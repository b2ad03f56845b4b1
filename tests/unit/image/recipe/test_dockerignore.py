"""``.dockerignore`` matching against Docker's documented examples and patternmatcher's own cases."""

from __future__ import annotations

import pytest

from cryobox.errors import InvalidArgument
from cryobox.image.recipe.dockerignore import IgnoreMatcher, go_clean, read_patterns

DOCS_EXAMPLE = """\
# comment
*/temp*
*/*/temp*
temp?
"""


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        ("somedir/temporary.txt", True),
        ("somedir/temp", True),
        ("somedir/subdir/temporary.txt", True),
        ("tempa", True),
        ("tempb", True),
        ("temp", False),
        ("temporary.txt", False),
        ("a/b/c/temp", False),
        ("comment", False),
    ],
)
def test_docs_example(path: str, ignored: bool) -> None:
    assert IgnoreMatcher.from_text(DOCS_EXAMPLE).ignored(path) is ignored


def test_double_star() -> None:
    matcher = IgnoreMatcher.from_text("**/*.go\n")
    assert matcher.ignored("main.go")
    assert matcher.ignored("a/b/c.go")
    assert not matcher.ignored("a/b/c.gox")


def test_exceptions_docs_examples() -> None:
    first = IgnoreMatcher.from_text("*.md\n!README*.md\nREADME-secret.md\n")
    assert first.ignored("CHANGES.md")
    assert not first.ignored("README.md")
    assert not first.ignored("README-public.md")
    assert first.ignored("README-secret.md")
    second = IgnoreMatcher.from_text("*.md\nREADME-secret.md\n!README*.md\n")
    assert not second.ignored("README-secret.md")
    assert second.ignored("other.md")


def test_directories_and_parents() -> None:
    matcher = IgnoreMatcher.from_text("node_modules\n/build/\n./dist\n!dist/keep.txt\n")
    assert matcher.ignored("node_modules")
    assert matcher.ignored("node_modules/a/b.js")
    assert not matcher.ignored("src/node_modules")
    assert matcher.ignored("build/out.o")
    assert matcher.ignored("dist/a.js")
    assert not matcher.ignored("dist/keep.txt")


def test_prefix_suffix_and_classes() -> None:
    assert IgnoreMatcher.from_text("a/**\n").ignored("a/b/c")
    assert IgnoreMatcher.from_text("**/foo\n").ignored("foo")
    assert IgnoreMatcher.from_text("**/foo\n").ignored("x/y/foo")
    assert IgnoreMatcher.from_text("**\n").ignored("anything/at/all")
    classes = IgnoreMatcher.from_text("file[0-9].txt\n")
    assert classes.ignored("file1.txt")
    assert not classes.ignored("filex.txt")
    # an escape only counts in a pattern with wildcards: patternmatcher compares the others literally
    assert IgnoreMatcher.from_text("a\\*b*\n").ignored("a*bc")
    assert not IgnoreMatcher.from_text("a\\*b*\n").ignored("axbc")
    assert not IgnoreMatcher.from_text("a\\*b\n").ignored("a*b")
    assert not IgnoreMatcher.from_text("a.b\n").ignored("axb")


def test_read_patterns_cleans() -> None:
    text = "\ufeff# c\n  /a/b/  \n!./c\n\n#x\nd/../e\n"
    assert read_patterns(text) == ["a/b", "!c", "e"]


def test_bad_patterns() -> None:
    with pytest.raises(InvalidArgument):
        IgnoreMatcher(["!"])
    with pytest.raises(InvalidArgument):
        IgnoreMatcher(["[a"])


@pytest.mark.parametrize(
    ("raw", "clean"), [("", "."), ("./a//b/", "a/b"), ("/../a", "/a"), ("../a", "../a"), ("a/..", ".")]
)
def test_go_clean(raw: str, clean: str) -> None:
    assert go_clean(raw) == clean
