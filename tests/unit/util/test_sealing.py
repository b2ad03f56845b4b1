"""The sealer of secrets at rest (``util/sealing.py``): round trip, wrong key and tampering refused with
``secret_unreadable``, legacy plain mappings, key rotation, and the key: ``CRYOBOX_SECRET_KEY`` or a key file
created once, mode 0600, by exactly one of concurrent first users."""

from __future__ import annotations

import logging
import os
import stat
import threading
from pathlib import Path

import pytest

from cryobox.errors import ERRORS_BY_CODE, InvalidArgument, SecretUnreadable
from cryobox.util.sealing import SECRET_KEY_ENV, Sealer, generate_key

SECRET = "hunter2-do-not-store-me"
ENV = {"API_TOKEN": SECRET, "UNICODE": "héllo ✓", "EMPTY": "", "MULTILINE": "a\nb"}


def test_round_trip_hides_the_values_and_never_repeats_a_token() -> None:
    sealer = Sealer.from_keys(generate_key())
    token = sealer.seal(ENV)
    assert SECRET not in token and "API_TOKEN" not in token and token.isascii()
    assert sealer.open(token) == ENV
    assert sealer.seal(ENV) != token  # a random IV per seal: equal envs are not recognisable
    assert sealer.open(sealer.seal({})) == {}


def test_a_wrong_key_is_secret_unreadable_and_names_no_key() -> None:
    key, other = generate_key(), generate_key()
    token = Sealer.from_keys(key).seal(ENV)
    with pytest.raises(SecretUnreadable) as info:
        Sealer.from_keys(other).open(token, what="the env of sandbox sb-1")
    err = info.value
    assert err.code == "secret_unreadable" and ERRORS_BY_CODE["secret_unreadable"] is SecretUnreadable
    assert "the env of sandbox sb-1" in err.message and SECRET_KEY_ENV in err.message
    assert key not in err.message and other not in err.message and SECRET not in str(err.to_wire())


@pytest.mark.parametrize("where", [0, 10, 60, -3])
def test_a_tampered_token_is_secret_unreadable(where: int) -> None:
    sealer = Sealer.from_keys(generate_key())
    token = sealer.seal(ENV)
    flipped = "A" if token[where] != "A" else "B"
    tampered = token[:where] + flipped + token[where + 1 :] if where >= 0 else token[:where] + flipped * 3
    assert tampered != token
    with pytest.raises(SecretUnreadable):
        sealer.open(tampered)
    for garbage in ("", "not a token", "ünïcode"):
        with pytest.raises(SecretUnreadable):
            sealer.open(garbage)


def test_stored_values_plain_mappings_of_older_versions_still_open() -> None:
    sealer = Sealer.from_keys(generate_key())
    legacy = {"A": "1", "B": SECRET}
    opened = sealer.open_stored(legacy)
    assert opened == legacy and opened is not legacy
    assert sealer.open_stored(sealer.seal(ENV)) == ENV
    for bad in (None, 3, ["A"], {"A": 1}):
        with pytest.raises(SecretUnreadable):
            sealer.open_stored(bad)


def test_rotation_the_first_key_seals_every_key_opens() -> None:
    old, new = generate_key(), generate_key()
    before = Sealer.from_keys(old).seal(ENV)
    rotated = Sealer.from_keys(f" {new} , {old} ")
    assert rotated.open(before) == ENV
    after = rotated.seal(ENV)
    assert Sealer.from_keys(new).open(after) == ENV
    with pytest.raises(SecretUnreadable):
        Sealer.from_keys(old).open(after)


def test_macs_are_the_tag_under_every_key_the_sealing_key_first() -> None:
    old, new = generate_key(), generate_key()
    rotated = Sealer.from_keys(f"{new},{old}")
    tags = rotated.macs("purpose", "message")
    assert tags == [Sealer.from_keys(new).mac("purpose", "message"), Sealer.from_keys(old).mac("purpose", "message")]
    assert tags[0] == rotated.mac("purpose", "message") and all(
        rotated.verify_mac("purpose", "message", t) for t in tags
    )
    assert rotated.macs("other", "message")[0] != tags[0] and rotated.macs("purpose", "other")[0] != tags[0]


def test_the_env_var_wins_and_a_malformed_one_is_refused_without_echo(tmp_path: Path) -> None:
    key = generate_key()
    key_file = tmp_path / "secrets" / "env.key"
    sealer = Sealer.load(key_file, {SECRET_KEY_ENV: key})
    assert Sealer.from_keys(key).open(sealer.seal(ENV)) == ENV
    assert not key_file.exists() and sealer.source == SECRET_KEY_ENV
    for bad in ("not-a-key", f"{key},short", "ÿ" * 44):
        with pytest.raises(InvalidArgument) as info:
            Sealer.load(key_file, {SECRET_KEY_ENV: bad})
        assert bad not in info.value.message
    assert Sealer.load(key_file, {SECRET_KEY_ENV: "  "}).source == f"key file {key_file}"  # blank: unset


def test_the_key_file_is_made_at_first_use_mode_0600_and_then_reused(tmp_path: Path) -> None:
    key_file = tmp_path / "data" / "secrets" / "env.key"
    sealer = Sealer.load(key_file, {})
    assert not key_file.exists(), "nothing is written before first use"
    token = sealer.seal(ENV)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert SECRET.encode() not in key_file.read_bytes()
    assert sorted(p.name for p in key_file.parent.iterdir()) == ["env.key"], "no temp file left behind"
    assert Sealer.load(key_file, {}).open(token) == ENV  # a restarted process reads the same key
    assert Sealer.from_keys(key_file.read_text()).open(token) == ENV  # the file holds exactly a key


def test_the_key_file_mode_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o277)  # would leave 0400 (and a 0500 directory) without the explicit chmod
    try:
        Sealer.from_key_file(tmp_path / "k" / "env.key").seal({})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k" / "env.key").stat().st_mode) == 0o600


def test_concurrent_first_users_agree_on_one_key(tmp_path: Path) -> None:
    key_file = tmp_path / "secrets" / "env.key"
    sealers = [Sealer.from_key_file(key_file) for _ in range(16)]
    start = threading.Barrier(len(sealers))
    tokens: list[str] = [""] * len(sealers)

    def first_use(i: int) -> None:
        start.wait()
        tokens[i] = sealers[i].seal({"i": str(i)})

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(len(sealers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reader = Sealer.from_key_file(key_file)
    assert [reader.open(token) for token in tokens] == [{"i": str(i)} for i in range(len(sealers))]
    assert sorted(p.name for p in key_file.parent.iterdir()) == ["env.key"]


def test_a_bad_key_file_is_refused_and_a_readable_one_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    with pytest.raises(InvalidArgument, match="holds no key"):
        Sealer.from_key_file(empty).seal({})
    wide = tmp_path / "wide.key"
    wide.write_text(generate_key() + "\n")
    wide.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="cryobox.util.sealing"):
        Sealer.from_key_file(wide).seal({})
    assert "readable by others" in caplog.text


def test_a_keyless_sealer_says_why_at_use() -> None:
    sealer = Sealer.load(None, {}, why="a registry on postgresql://db needs CRYOBOX_SECRET_KEY")
    with pytest.raises(InvalidArgument, match="needs CRYOBOX_SECRET_KEY"):
        sealer.seal({})
    with pytest.raises(InvalidArgument):
        sealer.open("token")
    assert Sealer.load(None, {SECRET_KEY_ENV: generate_key()}).open_stored({"A": "b"}) == {"A": "b"}
