"""Sandbox env sealed in the agent's durable records (``agent/sandbox/records.py``): no env value in the file, the
round trip, the key file beside the records directory (mode 0600, made at first use) or ``CRYOBOX_SECRET_KEY``,
a wrong key or a tampered record stops the load (and sets nothing aside), and records of older versions (a plain
``env``) load and are re-sealed."""

from __future__ import annotations

import json
import secrets
import stat
from dataclasses import asdict
from pathlib import Path

import pytest

from cryobox.agent.sandbox.records import SandboxRecord, SandboxRecords
from cryobox.errors import SecretUnreadable
from cryobox.util.sealing import SECRET_KEY_ENV, Sealer, generate_key


@pytest.fixture(autouse=True)
def no_key_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_KEY_ENV, raising=False)


def _record(sandbox_id: str, env: dict[str, str], metadata: dict[str, str] | None = None) -> SandboxRecord:
    return SandboxRecord(
        id=sandbox_id,
        template="base",
        cpus=1,
        memory_mib=512,
        state="hibernated",
        created_at=1.0,
        env=env,
        metadata=dict(metadata or {}),
    )


def test_a_record_on_disk_holds_no_env_value_and_round_trips(tmp_path: Path) -> None:
    secret, visible = f"s3cr3t-{secrets.token_hex(8)}", f"visible-{secrets.token_hex(8)}"
    records = SandboxRecords(tmp_path / "vol" / "sandboxes")
    record = _record("sb-1", {"TOKEN": secret, "UNICODE": "✓"}, metadata={"label": visible})
    records.write(record)
    written = (records.root / "sb-1.json").read_bytes()
    assert visible.encode() in written, "the record is in this file (the check below can see a value)"
    assert secret.encode() not in written and b"TOKEN" not in written
    assert isinstance(json.loads(written)["env"], str)
    assert records.load_all() == [record]
    assert SandboxRecords(records.root).load_all() == [record]  # a restarted agent: the same key file
    assert sorted(p.name for p in records.root.iterdir()) == ["sb-1.json"]


def test_the_key_file_is_beside_the_records_made_at_first_use_mode_0600(tmp_path: Path) -> None:
    root = tmp_path / "vol" / "sandboxes"
    records = SandboxRecords(root)
    key_file = tmp_path / "vol" / "secrets" / "records.key"
    assert records.load_all() == [] and not key_file.exists(), "no key before a record needs one"
    records.write(_record("sb-1", {"A": "1"}))
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert records.sealer.source == f"key file {key_file}"


def test_the_env_var_key_wins_over_the_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = generate_key()
    monkeypatch.setenv(SECRET_KEY_ENV, key)
    records = SandboxRecords(tmp_path / "vol" / "sandboxes")
    records.write(_record("sb-1", {"A": "1"}))
    assert not (tmp_path / "vol" / "secrets").exists()
    monkeypatch.delenv(SECRET_KEY_ENV)
    assert SandboxRecords(records.root, Sealer.from_keys(key)).load_all()[0].env == {"A": "1"}


def test_a_wrong_key_stops_the_load_and_sets_nothing_aside(tmp_path: Path) -> None:
    root = tmp_path / "vol" / "sandboxes"
    SandboxRecords(root, Sealer.from_keys(generate_key())).write(_record("sb-1", {"A": "1"}))
    with pytest.raises(SecretUnreadable, match="sb-1") as info:
        SandboxRecords(root, Sealer.from_keys(generate_key())).load_all()
    assert info.value.code == "secret_unreadable"
    assert sorted(p.name for p in root.iterdir()) == ["sb-1.json"], "a wrong key must not cost the sandbox"


def test_a_tampered_record_is_secret_unreadable(tmp_path: Path) -> None:
    records = SandboxRecords(tmp_path / "vol" / "sandboxes")
    records.write(_record("sb-1", {"A": "1"}))
    path = records.root / "sb-1.json"
    data = json.loads(path.read_text())
    token: str = data["env"]
    data["env"] = token[:30] + ("A" if token[30] != "A" else "B") + token[31:]
    path.write_text(json.dumps(data))
    with pytest.raises(SecretUnreadable, match="tampered"):
        records.load_all()


def test_records_of_older_versions_load_and_are_resealed(tmp_path: Path) -> None:
    secret = f"s3cr3t-{secrets.token_hex(8)}"
    records = SandboxRecords(tmp_path / "vol" / "sandboxes")
    records.root.mkdir(parents=True)
    old = _record("sb-old", {"TOKEN": secret})
    (records.root / "sb-old.json").write_text(json.dumps({"version": 1, **asdict(old)}))  # as before sealing
    no_env = {k: v for k, v in asdict(_record("sb-none", {})).items() if k != "env"}
    (records.root / "sb-none.json").write_text(json.dumps({"version": 1, **no_env}))
    assert secret.encode() in (records.root / "sb-old.json").read_bytes()
    loaded = {r.id: r for r in records.load_all()}
    assert loaded == {"sb-old": old, "sb-none": _record("sb-none", {})}
    assert secret.encode() not in (records.root / "sb-old.json").read_bytes(), "re-sealed by the load"
    assert isinstance(json.loads((records.root / "sb-none.json").read_text())["env"], str)
    assert {r.id: r for r in records.load_all()} == loaded
