"""``templateID`` ``name:tag`` at create: the template's newest ready build carries the tag, or a clear refusal."""

from __future__ import annotations

import pytest

from cryobox.compat.e2b.tags import split_name, tagged_template
from cryobox.errors import NotFound, StateError
from cryobox.registry.builds import BuildRecord


def build(build_id: str, tags: tuple[str, ...], *, at: float, status: str = "ready") -> BuildRecord:
    return BuildRecord(build_id, "app", "ws", status, created_at=at, finished_at=at + 5, tags=tags)


def test_split_name() -> None:
    assert split_name("app:stable") == ("app", "stable")
    assert split_name("app") == ("app", None)
    assert split_name("app:") == ("app", "")


def test_a_tag_on_the_newest_ready_build_is_the_template() -> None:
    failed = build("b3", (), at=3, status="error")
    builds = [build("b1", ("v1",), at=1), build("b2", ("default", "stable"), at=2), failed]
    assert tagged_template("app", "stable", builds) == "app"
    assert tagged_template("app", "default", list(reversed(builds))) == "app"


def test_the_newest_is_the_last_finished() -> None:
    older = BuildRecord("b1", "app", "ws", "ready", created_at=1, finished_at=50, tags=("late",))
    newer = BuildRecord("b2", "app", "ws", "ready", created_at=2, finished_at=10, tags=("early",))
    assert tagged_template("app", "late", [older, newer]) == "app"
    with pytest.raises(StateError):
        tagged_template("app", "early", [older, newer])


def test_a_tag_on_an_older_build_is_a_conflict_naming_the_current_one() -> None:
    builds = [build("b1", ("v1",), at=1), build("b2", ("default",), at=2)]
    with pytest.raises(StateError) as caught:
        tagged_template("app", "v1", builds)
    assert caught.value.http_status == 409 and "b2" in str(caught.value) and "app:v1" in str(caught.value)


def test_unknown_tags_are_not_found() -> None:
    builds = [build("b1", ("default",), at=1), build("b2", ("beta",), at=2, status="error")]
    for tag in ("nope", "beta"):  # unknown, or only on a failed build
        with pytest.raises(NotFound):
            tagged_template("app", tag, builds)


def test_a_template_without_builds_has_only_its_default() -> None:
    assert tagged_template("base", "default", []) == "base"
    with pytest.raises(NotFound):
        tagged_template("base", "stable", [])
    with pytest.raises(NotFound):  # builds, none ready yet: nothing to restore under that tag
        tagged_template("app", "default", [build("b1", ("default",), at=1, status="building")])
