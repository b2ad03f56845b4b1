"""Splitting an uploaded context into one deterministic blob per COPY step, with Docker's source semantics."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest

from cryobox.errors import InvalidArgument, PayloadTooLarge
from cryobox.image.recipe.contexts import ContextLimits, split_context
from cryobox.image.recipe.dockerfile import parse_dockerfile
from cryobox.image.recipe.model import Base, Recipe, Step
from tests.support.contexttar import Member, blob_file, blob_members, context_tar

LIMITS = ContextLimits()
CONTEXT = [
    Member(".dockerignore", b"# build output\n**/*.pyc\nsecrets\n!secrets/public.pem\n"),
    Member("app", kind=tarfile.DIRTYPE, mode=0o755),
    Member("app/main.py", b"print('hi')\n", mode=0o755),
    Member("app/main.pyc", b"\0"),
    Member("app/lib/util.py", b"x = 1\n"),  # no entry for app/lib: an implied directory
    Member("app/current", kind=tarfile.SYMTYPE, linkname="main.py"),
    Member("requirements.txt", b"flask\n"),
    Member("requirements-dev.txt", b"pytest\n"),
    Member("secrets/key.pem", b"private"),
    Member("secrets/public.pem", b"public"),
]


def _split(dockerfile: str, members: list[Member] = CONTEXT) -> tuple[Recipe, dict[str, bytes]]:
    return split_context(parse_dockerfile(dockerfile), io.BytesIO(context_tar(members, gzipped=True)), limits=LIMITS)


def test_each_copy_gets_its_own_blob_named_by_sha256() -> None:
    recipe, blobs = _split(
        "FROM debian:12\nCOPY requirements*.txt /tmp/\nRUN pip install -r /tmp/requirements.txt\nCOPY app /srv/app\n"
    )
    first, run, second = recipe.steps
    assert run.context == ""
    assert set(blobs) == {first.context, second.context}
    for digest, blob in blobs.items():
        assert hashlib.sha256(blob).hexdigest() == digest
    assert sorted(blob_members(blobs[first.context])) == ["requirements-dev.txt", "requirements.txt"]
    app = blob_members(blobs[second.context])
    assert sorted(app) == ["app", "app/current", "app/lib/util.py", "app/main.py"]  # *.pyc ignored
    assert app["app/current"].issym() and app["app/main.py"].mode == 0o755
    assert blob_file(blobs[second.context], "app/lib/util.py") == b"x = 1\n"
    assert recipe.contexts() == (first.context, second.context)


def test_same_files_same_hash_whatever_the_upload_order() -> None:
    dockerfile = "FROM x\nCOPY . /ctx\n"
    one, _ = _split(dockerfile)
    two, _ = _split(dockerfile, list(reversed(CONTEXT)))
    assert one.steps[0].context == two.steps[0].context
    changed = [*CONTEXT[:-1], Member("secrets/public.pem", b"rotated")]
    three, _ = _split(dockerfile, changed)
    assert three.steps[0].context != one.steps[0].context


def test_dockerignore_exceptions_and_whole_context() -> None:
    recipe, blobs = _split("FROM x\nCOPY . /ctx\nCOPY ./secrets/ /s/\n")
    everything = blob_members(blobs[recipe.steps[0].context])
    assert "secrets/public.pem" in everything and "secrets/key.pem" not in everything
    assert ".dockerignore" in everything and "app/main.pyc" not in everything
    assert sorted(blob_members(blobs[recipe.steps[1].context])) == ["secrets/public.pem"]


def test_globs_stay_in_one_segment_and_absolute_sources_mean_the_root() -> None:
    recipe, blobs = _split("FROM x\nCOPY /app/*.py /a/\nCOPY ap? /b/\n")
    assert sorted(blob_members(blobs[recipe.steps[0].context])) == ["app/main.py"]
    assert "app/lib/util.py" in blob_members(blobs[recipe.steps[1].context])


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("missing.txt", "matches nothing"),
        ("app/main.pyc", "excluded by .dockerignore"),
        ("*.go", "matches nothing"),
        ("../outside", "leaves the build context"),
        ("app/../../x", "leaves the build context"),
        ("[a", "unterminated"),
    ],
)
def test_bad_sources_name_the_line_and_source(source: str, needle: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        _split(f'FROM x\nRUN true\nCOPY ["{source}", "/d/"]\n')
    assert needle in info.value.message
    assert info.value.details == {"line": 3, "instruction": "COPY", "source": source}


def test_steps_with_a_context_already_are_kept() -> None:
    recipe = Recipe(Base("template", "base"), (Step("COPY", ("a", "/a"), context="f" * 64, line=1),))
    split, blobs = split_context(recipe, io.BytesIO(context_tar([])), limits=LIMITS)
    assert split == recipe and blobs == {}


def test_limits_apply_while_splitting() -> None:
    with pytest.raises(PayloadTooLarge):
        split_context(
            parse_dockerfile("FROM x\nCOPY . /\n"),
            io.BytesIO(context_tar(CONTEXT)),
            limits=ContextLimits(max_members=3),
        )
