"""/etc/cryobox/defaults.json: read whole or ignored whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cryobox.guest.defaults import ImageDefaults, read_defaults


def test_absent_is_empty(tmp_path: Path) -> None:
    assert read_defaults(str(tmp_path / "none.json")) == ImageDefaults()


def test_a_full_file(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"env": {"A": "1"}, "workdir": "/app", "user": "app"}))
    assert read_defaults(str(path)) == ImageDefaults(env={"A": "1"}, workdir="/app", user="app")


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        json.dumps({"env": {"A=B": "1"}}),
        json.dumps({"env": {"A": 1}}),
        json.dumps({"workdir": "relative"}),
        json.dumps({"user": 1000}),
    ],
)
def test_a_malformed_file_is_ignored_whole(tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.json"
    path.write_text(content)
    assert read_defaults(str(path)) == ImageDefaults()
    assert "ignored" in capsys.readouterr().err
