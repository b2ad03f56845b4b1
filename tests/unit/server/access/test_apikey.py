"""API key storage and bearer checks."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cryobox.server.access.apikey import load_or_create_key


def test_generates_once_with_mode_0600(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    old_umask = os.umask(0)  # a permissive umask must not widen the key file
    try:
        key, generated = load_or_create_key(data_dir, env={})
    finally:
        os.umask(old_umask)
    assert generated is True
    assert key.startswith("cbx_")
    assert len(key) > 20
    path = data_dir / "api_key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == key

    again, generated_again = load_or_create_key(data_dir, env={})
    assert (again, generated_again) == (key, False)


def test_two_data_dirs_get_different_keys(tmp_path: Path) -> None:
    a, _ = load_or_create_key(tmp_path / "a", env={})
    b, _ = load_or_create_key(tmp_path / "b", env={})
    assert a != b


def test_env_key_wins(tmp_path: Path) -> None:
    load_or_create_key(tmp_path, env={})
    assert load_or_create_key(tmp_path, env={"CRYOBOX_API_KEY": "from-env"}) == ("from-env", False)


def test_env_key_creates_no_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    assert load_or_create_key(data_dir, env={"CRYOBOX_API_KEY": "k"}) == ("k", False)
    assert not (data_dir / "api_key").exists()


def test_empty_env_key_is_ignored(tmp_path: Path) -> None:
    key, generated = load_or_create_key(tmp_path, env={"CRYOBOX_API_KEY": ""})
    assert generated is True and key.startswith("cbx_")
