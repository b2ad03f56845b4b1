"""MachineConfig's JSON form (kept in snapshot manifests) and the host Paths layout."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cryobox.agent.memory.hot import default_hot_dir
from cryobox.agent.vm.accel import Accel
from cryobox.agent.vm.machine import MachineConfig
from cryobox.config import Paths

# -- MachineConfig -----------------------------------------------------------------------------------------------


def _config(accel: Accel, **kw: object) -> MachineConfig:
    fields: dict[str, object] = {
        "memory_mib": 512,
        "cpus": 2,
        "accel": accel,
        "kernel": Path("/var/cache/cryobox/kernel/abc/vmlinuz"),
        "initrd": Path("/var/cache/cryobox/initramfs/def/initrd.img"),
        "tsc_khz": 2_400_000,
        "norandmaps": accel.default_norandmaps,
    }
    fields.update(kw)
    return MachineConfig(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("accel", list(Accel))
@pytest.mark.parametrize("norandmaps", [True, False])
def test_machine_config_json_round_trip(accel: Accel, norandmaps: bool) -> None:
    config = _config(accel, norandmaps=norandmaps, memory_mib=1536, cpus=4)
    data = json.loads(json.dumps(config.to_json()))  # as stored in a manifest
    assert data == {
        "memory_mib": 1536,
        "cpus": 4,
        "accel": accel.value,
        "kernel": "/var/cache/cryobox/kernel/abc/vmlinuz",
        "initrd": "/var/cache/cryobox/initramfs/def/initrd.img",
        "tsc_khz": 2_400_000,
        "norandmaps": norandmaps,
        "nic": False,
    }
    back = MachineConfig.from_json(data)
    assert back == config
    assert back.identity() == config.identity()
    assert back.kernel_cmdline == config.kernel_cmdline
    assert isinstance(back.kernel, Path) and isinstance(back.accel, Accel)


def test_machine_config_without_nic_key_reads_as_no_nic() -> None:
    """Manifests written before NICs existed restore into a machine without one."""
    config = _config(Accel.TCG)
    data = config.to_json()
    del data["nic"]
    assert MachineConfig.from_json(data).nic is False


def test_machine_config_from_json_ignores_extra_keys() -> None:
    config = _config(Accel.TCG)
    data = {**config.to_json(), "added_by_a_newer_version": True}
    assert MachineConfig.from_json(data) == config


def test_machine_config_from_json_rejects_unknown_accel() -> None:
    data = {**_config(Accel.KVM).to_json(), "accel": "hvf"}
    with pytest.raises(ValueError):
        MachineConfig.from_json(data)


def test_machine_config_from_json_missing_key() -> None:
    data = _config(Accel.KVM).to_json()
    del data["tsc_khz"]
    with pytest.raises(KeyError):
        MachineConfig.from_json(data)


# -- Paths -------------------------------------------------------------------------------------------------------

HOT = re.compile(r"/dev/shm/cryobox-[0-9a-f]{12}")


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CRYOBOX_HOT_DIR", "CRYOBOX_DATA_DIR", "CRYOBOX_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_hot_dir_default_is_per_data_dir(tmp_path: Path) -> None:
    a = Paths(data_dir=tmp_path / "a", cache_dir=tmp_path / "cache")
    assert HOT.fullmatch(str(a.hot_dir)), a.hot_dir
    again = Paths(data_dir=tmp_path / "a", cache_dir=tmp_path / "other-cache")
    assert again.hot_dir == a.hot_dir  # stable: depends on the data dir only
    b = Paths(data_dir=tmp_path / "b", cache_dir=tmp_path / "cache")
    assert HOT.fullmatch(str(b.hot_dir))
    assert b.hot_dir != a.hot_dir


def test_hot_dir_default_does_not_depend_on_spelling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a")
    monkeypatch.chdir(tmp_path)
    plain = Paths(data_dir=tmp_path / "a", cache_dir=tmp_path)
    assert Paths(data_dir=Path("a"), cache_dir=tmp_path).hot_dir == plain.hot_dir
    assert Paths(data_dir=tmp_path / "x" / ".." / "a", cache_dir=tmp_path).hot_dir == plain.hot_dir
    assert Paths(data_dir=tmp_path / "link", cache_dir=tmp_path).hot_dir == plain.hot_dir


def test_hot_dir_default_matches_the_agent(tmp_path: Path) -> None:
    paths = Paths(data_dir=tmp_path / "a", cache_dir=tmp_path / "cache")
    assert paths.hot_dir == default_hot_dir(tmp_path / "a", {})


def test_hot_dir_env_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRYOBOX_HOT_DIR", str(tmp_path / "hot"))
    assert Paths(data_dir=tmp_path / "a", cache_dir=tmp_path / "c").hot_dir == tmp_path / "hot"
    assert Paths(data_dir=tmp_path / "b", cache_dir=tmp_path / "c").hot_dir == tmp_path / "hot"
    monkeypatch.setenv("CRYOBOX_HOT_DIR", "")
    assert HOT.fullmatch(str(Paths(data_dir=tmp_path / "a", cache_dir=tmp_path / "c").hot_dir))


def test_explicit_hot_dir_wins_over_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRYOBOX_HOT_DIR", str(tmp_path / "from-env"))
    paths = Paths(data_dir=tmp_path / "a", cache_dir=tmp_path / "c", hot_dir=tmp_path / "given")
    assert paths.hot_dir == tmp_path / "given"


def test_layout(tmp_path: Path) -> None:
    data, cache = tmp_path / "data", tmp_path / "cache"
    paths = Paths(data_dir=data, cache_dir=cache)
    assert paths.volume_dir == data / "vol"
    assert paths.run_dir == data / "vol" / "run"
    assert paths.snapshots_dir == data / "vol" / "snapshots"
    assert paths.hibernate_dir == data / "vol" / "hibernate"
    assert paths.bake_dir == data / "bake"
    assert paths.images_dir == cache / "images"
    assert paths.templates_dir == cache / "templates"


def test_ensure_creates_the_top_level_dirs(tmp_path: Path) -> None:
    paths = Paths(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    paths.ensure()
    paths.ensure()  # idempotent
    for path in (paths.data_dir, paths.bake_dir, paths.images_dir, paths.templates_dir):
        assert path.is_dir(), path
    assert not paths.hot_dir.is_relative_to(tmp_path)


def test_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRYOBOX_DATA_DIR", str(tmp_path / "env-data"))
    monkeypatch.setenv("CRYOBOX_CACHE_DIR", str(tmp_path / "env-cache"))
    paths = Paths.from_env()
    assert paths.data_dir == (tmp_path / "env-data").resolve()
    assert paths.cache_dir == (tmp_path / "env-cache").resolve()
    given = Paths.from_env(data_dir=tmp_path / "d", cache_dir=tmp_path / "c")
    assert (given.data_dir, given.cache_dir) == ((tmp_path / "d").resolve(), (tmp_path / "c").resolve())
    assert given.hot_dir == Paths(data_dir=tmp_path / "d", cache_dir=tmp_path).hot_dir


def test_from_env_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = Paths.from_env()
    assert paths.data_dir == Path("/var/lib/cryobox").resolve()
    assert paths.cache_dir == Path("/var/cache/cryobox").resolve()
