"""The pure parts of ``cryobox bench snapshot``: Pss parsing, stats and the JSON shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from rich.console import Console

from cryobox.bench import snapshot_sweep
from cryobox.bench.pss import allocated_bytes, mapping_kib, parse_rollup, rollup_kib, smaps_mapping_kib, sum_mib
from cryobox.bench.snapshot import binaries_to_run, capture_breakdown, guest_used_mib
from cryobox.bench.snapshot_api import Api
from cryobox.bench.snapshot_report import BenchError, combine_results, comparison_table, result_table, version_key
from cryobox.bench.snapshot_result import PRIVATE_COPY_BASIS, TARGETS, TREE_COUNT, Samples, build_result, stats_n
from cryobox.config import Paths

ROLLUP = """\
55d4c8a3e000-7ffd1f5fe000 ---p 00000000 00:00 0                          [rollup]
Rss:              204800 kB
Pss:              102400 kB
Pss_Dirty:         10240 kB
Pss_Anon:          8192 kB
Pss_File:          1024 kB
Pss_Shmem:         93184 kB
Shared_Clean:     196608 kB
Private_Dirty:      8192 kB
Swap:                  0 kB
SwapPss:               0 kB
Locked:                0 kB
"""

MEMINFO = """\
MemTotal:         492164 kB
MemFree:          380000 kB
MemAvailable:     420000 kB
Buffers:            1234 kB
HugePages_Total:       0
"""


def fake_proc(tmp_path: Path, pss_kib: dict[int, int]) -> Path:
    for pid, pss in pss_kib.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "smaps_rollup").write_text(ROLLUP.replace("102400", str(pss)))
    return tmp_path


def test_parse_rollup_reads_kib_lines_only() -> None:
    fields = parse_rollup(ROLLUP)
    assert fields["Pss"] == 102400
    assert fields["Rss"] == 204800
    assert fields["Pss_Shmem"] == 93184
    assert "55d4c8a3e000-7ffd1f5fe000 ---p 00000000 00" not in fields
    assert all(isinstance(v, int) for v in fields.values())


def test_parse_rollup_skips_lines_without_unit() -> None:
    assert "HugePages_Total" not in parse_rollup(MEMINFO)
    assert parse_rollup(MEMINFO)["MemTotal"] == 492164


def test_rollup_and_sum_from_proc(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {10: 1024, 11: 2048})
    assert rollup_kib(10, proc=proc) == 1024
    assert rollup_kib(11, "Rss", proc=proc) == 204800
    assert sum_mib([10, 11], proc=proc) == 3.0


def test_rollup_missing_process_or_field(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {10: 1024})
    with pytest.raises(RuntimeError, match="pid 99"):
        rollup_kib(99, proc=proc)
    with pytest.raises(RuntimeError, match="no 'Nope' line"):
        rollup_kib(10, "Nope", proc=proc)


def test_allocated_bytes_of_sparse_file(tmp_path: Path) -> None:
    path = tmp_path / "memory"
    with open(path, "wb") as fh:
        fh.truncate(64 << 20)
        fh.seek(1 << 20)
        fh.write(b"\xff" * (1 << 20))
    allocated = allocated_bytes(path)
    assert 1 << 20 <= allocated < 64 << 20


SMAPS = """\
7f0000000000-7f0010000000 rw-p 00000000 00:1a 4242                       /dev/shm/cryobox-x/snap-1/memory
Rss:                1024 kB
Pss:                 300 kB
Anonymous:           100 kB
VmFlags: rd wr mr mw me ac sd
7f0010000000-7f0020000000 rw-p 00000000 00:00 0
Rss:                4096 kB
Pss:                4096 kB
Anonymous:          4096 kB
7f0020000000-7f0030000000 rw-p 10000000 00:1a 4242                       /dev/shm/cryobox-x/snap-1/memory (deleted)
Rss:                  10 kB
Pss:                   5 kB
Anonymous:             5 kB
7f0030000000-7f0040000000 r--p 00000000 00:1a 4243                       /dev/shm/cryobox-x/snap-10/memory
Rss:                 999 kB
Pss:                 999 kB
"""


def test_mapping_kib_sums_one_file_only() -> None:
    fields = mapping_kib(SMAPS, "/dev/shm/cryobox-x/snap-1/memory")
    assert fields == {"Rss": 1034, "Pss": 305, "Anonymous": 105}
    assert mapping_kib(SMAPS, "/nope") == {}


def test_smaps_mapping_kib_from_proc(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "smaps").write_text(SMAPS)
    assert smaps_mapping_kib(7, Path("/dev/shm/cryobox-x/snap-10/memory"), proc=tmp_path)["Pss"] == 999
    with pytest.raises(RuntimeError, match="does not map"):
        smaps_mapping_kib(7, Path("/other"), proc=tmp_path)


def test_capture_breakdown_keeps_numbers() -> None:
    manifest = {"capture": {"mode": "background", "pause_ms": 31.5, "qemu_downtime_ms": None, "total_ms": 900}}
    assert capture_breakdown(manifest) == {"pause_ms": 31.5, "total_ms": 900.0}
    assert capture_breakdown({}) == {}


def test_guest_used_mib() -> None:
    assert guest_used_mib(MEMINFO) == pytest.approx((492164 - 380000) / 1024)
    with pytest.raises(BenchError):
        guest_used_mib("Buffers: 1 kB\n")


def test_stats_n_adds_count_and_rejects_empty() -> None:
    assert stats_n([3.0, 1.0, 2.0]) == {"p50": 2.0, "p90": 3.0, "p99": 3.0, "max": 3.0, "n": 3}
    with pytest.raises(BenchError):
        stats_n([])


def samples() -> Samples:
    return Samples(
        pause_512=[40.0, 50.0, 60.0],
        pause_2048=[50.0, 60.0, 70.0],
        snapshot_wall_512=[900.0, 1000.0, 1100.0],
        snapshot_wall_2048=[2000.0, 2100.0, 2200.0],
        snapshot_size_512=[float(200 << 20)] * 3,
        restore_total=[400.0] * 10,
        restore_call=[300.0] * 10,
        restore_first_exec=[100.0] * 10,
        restore_boot=[250.0] * 10,
        tree_total_ms=2000.0,
        tree_call_ms=1500.0,
        tree_child_ready_ms=[1900.0 + i for i in range(TREE_COUNT)],
        tree_child_boot=[500.0] * TREE_COUNT,
        pss_children_mib=[20.0] * TREE_COUNT,
        rss_children_mib=[100.0] * TREE_COUNT,
        pss_shmem_children_mib=[10.0] * TREE_COUNT,
        pss_ram_children_mib=[12.0] * TREE_COUNT,
        cow_ram_children_mib=[2.0] * TREE_COUNT,
        capture_512=[{"pause_ms": 40.0, "qemu_downtime_ms": 30.0}, {"pause_ms": 50.0, "qemu_downtime_ms": 35.0}],
        capture_2048=[{"pause_ms": 60.0}],
        snapshot_memory_bytes=160 << 20,
        hot_copy_bytes=160 << 20,
        guest_used_mib=150.0,
    )


def test_build_result_shape_and_ratios() -> None:
    s = samples()
    s.dirty_sweep = [
        {
            "dirtied_mib": 16.0,
            "snapshot_ms": 200.0,
            "snapshot_ms_again": 150.0,
            "unique_mib": 17.0,
            "shared_mib": 1.0,
        },
        {
            "dirtied_mib": 64.0,
            "snapshot_ms": 300.0,
            "snapshot_ms_again": 180.0,
            "unique_mib": 65.0,
            "shared_mib": 1.0,
        },
        {
            "dirtied_mib": 272.0,
            "snapshot_ms": 600.0,
            "snapshot_ms_again": 250.0,
            "unique_mib": 273.0,
            "shared_mib": 1.0,
        },
    ]
    result = build_result(s, n=3, cores=2, accelerator="tcg", qemu="QEMU 7.2", server_version="0.1", measured_at="now")
    json.dumps(result)  # serialisable as is
    for key in ("pause_ms_512", "pause_ms_2048", "snapshot_ms", "restore_ms", "restore_boot_ms"):
        assert set(result[key]) == {"p50", "p90", "p99", "max", "n"}
    assert result["restore_ms"]["n"] == 10
    assert result["pause_ratio"] == 1.2  # p50 60 / p50 50
    assert result["fork_tree16_ms"] == 2000.0
    assert result["fork_tree_over_restore"] == 5.0
    assert result["pss_16_restores_mib"] == 320.0
    assert result["private_copy_mib"] == 160.0
    assert result["private_copies_16_mib"] == 2560.0
    assert result["pss_ratio"] == 0.125
    assert result["pss_guest_ram_16_restores_mib"] == 192.0
    assert result["pss_ratio_guest_ram"] == 0.075
    assert result["pss_qemu_other_16_restores_mib"] == 128.0
    assert result["guest_ram_cow_16_restores_mib"] == 32.0
    assert result["capture_512"]["qemu_downtime_ms"] == {"p50": 30.0, "p90": 35.0, "p99": 35.0, "max": 35.0, "n": 2}
    assert set(result["capture_2048"]) == {"pause_ms"}
    assert result["samples"]["pause_ms_512"] == [40.0, 50.0, 60.0]
    assert result["private_copy_basis"] == PRIVATE_COPY_BASIS
    assert result["targets"] == TARGETS
    assert result["machine"] == {"cores": 2, "accelerator": "tcg"}
    assert result["qemu"] == "QEMU 7.2"
    assert (result["dirty_sweep_s_per_gib"], result["dirty_sweep_s_per_gib_again"]) == (1.6, 0.4)
    assert result["checks"] == {
        "pause_ms_512_p50": True,
        "pause_ratio": True,
        "fork_tree_over_restore": True,
        "pss_ratio": True,
        "pause_ms_issue18": False,  # p50s 50 and 60 ms > 30
        "pause_ratio_issue18": True,  # 1.2
        "lazy_pause_ms": False,  # none measured
        "dirty_sweep_s_per_gib": False,  # (600 - 200) ms over 256 MiB: 1.6 s/GiB
        "dirty_sweep_s_per_gib_again": True,  # (250 - 150) ms over 256 MiB: 0.4 s/GiB
    }


def test_build_result_flags_misses() -> None:
    s = samples()
    s.pause_2048 = [500.0] * 3
    s.tree_total_ms = 4000.0
    result = build_result(s, n=3, cores=2, accelerator="tcg", qemu="q", server_version="v", measured_at="now")
    assert result["checks"]["pause_ratio"] is False
    assert result["checks"]["fork_tree_over_restore"] is False


def test_build_result_refuses_zero_denominator() -> None:
    s = samples()
    s.snapshot_memory_bytes = 0
    with pytest.raises(BenchError):
        build_result(s, n=3, cores=2, accelerator="tcg", qemu="q", server_version="v", measured_at="now")


def test_table_renders() -> None:
    result = build_result(samples(), n=3, cores=2, accelerator="tcg", qemu="q", server_version="v", measured_at="now")
    console = Console(record=True, width=80)  # what rich uses when stderr is not a terminal
    console.print(result_table(result))
    text = console.export_text()
    assert "pause ms 512M (64M dirty)" in text  # not wrapped
    assert "fork-tree 16 ms (all exec)" in text
    assert "Pss ratio" in text
    assert "QEMU downtime ms 512M" in text
    assert "≤ 0.25 ok" in text


def test_build_result_adds_lazy_sweep_and_hot_dir() -> None:
    s = samples()
    s.lazy_pause = [600.0, 700.0, 650.0]
    s.lazy_capture = [{"pause_ms": 600.0, "total_ms": 900.0}]
    s.dirty_sweep = [{"dirtied_mib": 16.0, "unique_mib": 20.0, "shared_mib": 140.0, "snapshot_ms": 1500.0}]
    s.shm_before_bytes, s.shm_after_bytes = 132 << 20, 700 << 20
    s.capture_modes = {"512": ["precopy", "precopy"], "lazy": ["stopped", "precopy"]}
    result = build_result(
        s, n=3, cores=2, accelerator="tcg", qemu="q", server_version="v", measured_at="now", qemu_path="/opt/q"
    )
    json.dumps(result)
    assert result["lazy_pause_ms"]["p50"] == 650.0
    assert result["lazy_capture"]["total_ms"]["p50"] == 900.0
    assert result["dirty_sweep"] == s.dirty_sweep
    assert result["shm_mib_before_snapshots"] == 132.0
    assert result["shm_mib_after_10_snapshots"] == 700.0
    assert result["qemu_binary"] == "/opt/q"
    assert result["capture_modes"] == {"512": ["precopy"], "lazy": ["precopy", "stopped"]}
    assert result["checks"]["pause_ms_issue18"] is False  # p50s 50 and 60 > 30
    assert result["checks"]["pause_ratio_issue18"] is True  # 1.2
    console = Console(record=True, width=80)
    console.print(result_table(result))
    assert "lazy pause ms (512M)" in console.export_text()


def test_build_result_without_the_new_steps() -> None:
    result = build_result(samples(), n=3, cores=2, accelerator="tcg", qemu="q", server_version="v", measured_at="now")
    assert result["lazy_pause_ms"] is None
    assert result["dirty_sweep"] == []
    assert result["shm_mib_after_10_snapshots"] is None


def test_combine_results_keeps_the_default_binary_on_top() -> None:
    old = build_result(
        samples(),
        n=3,
        cores=2,
        accelerator="tcg",
        qemu="QEMU emulator version 7.2.22 (Debian)",
        server_version="v",
        measured_at="now",
    )
    s = samples()
    s.pause_512 = [20.0, 21.0, 22.0]
    new = build_result(
        s,
        n=3,
        cores=2,
        accelerator="tcg",
        qemu="QEMU emulator version 10.0.2 (Debian)",
        server_version="v",
        measured_at="now",
        qemu_path="/opt/cryobox/qemu-10.0.2/usr/bin/qemu-system-x86_64",
    )
    combined = combine_results([old, new])
    json.dumps(combined)
    assert combined["pause_ms_512"] == old["pause_ms_512"]
    assert combined["qemu"] == old["qemu"]
    assert list(combined["by_qemu"]) == ["7.2.22", "10.0.2"]
    assert combined["by_qemu"]["10.0.2"]["pause_ms_512"]["p50"] == 21.0
    assert combined["qemu_comparison"]["pause_ms_512_p50"] == {"7.2.22": 50.0, "10.0.2": 21.0}
    assert combined["qemu_comparison"]["lazy_pause_ms_p50"] == {"7.2.22": None, "10.0.2": None}
    console = Console(record=True, width=80)
    console.print(comparison_table(combined))
    assert "pause_ms_512_p50" in console.export_text()


def test_version_key() -> None:
    assert version_key("QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)") == "10.0.2"
    assert version_key("something else") == "something else"


def test_binaries_to_run_dedupes_and_checks(tmp_path: Path) -> None:
    fake = tmp_path / "usr" / "bin" / "qemu-system-x86_64"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert binaries_to_run([str(fake), str(fake)], default="qemu-system-x86_64") == ["qemu-system-x86_64", str(fake)]
    with pytest.raises(BenchError, match="--qemu"):
        binaries_to_run([str(tmp_path / "nope" / "qemu-system-x86_64")], default="qemu-system-x86_64")


def test_the_dirty_sweep_takes_the_p50_of_several_sandboxes_and_deletes_them(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "data", tmp_path / "cache")
    walls = iter([0.05, 0.02, 0.01, 0.03, 0.04, 0.02] * len(snapshot_sweep.SWEEP_MIB))
    now = [1000.0]

    class FakeApi:
        def __init__(self) -> None:
            self.sandboxes: set[str] = set()
            self.snapshots: set[str] = set()
            self.made = 0
            self.taken = 0
            self.commands: list[str] = []

        def create(self, body: dict[str, Any]) -> dict[str, Any]:
            assert body == {"template": "bench-2g"}
            self.made += 1
            self.sandboxes.add(f"sbx{self.made}")
            return {"id": f"sbx{self.made}"}

        def exec(self, sandbox_id: str, cmd: str) -> dict[str, Any]:
            self.commands.append(cmd)
            return {"exit_code": 0}

        def snapshot(self, sandbox_id: str) -> dict[str, Any]:
            now[0] += next(walls)  # the snapshot's wall time, on the sweep's clock
            self.taken += 1
            sid = f"snap{self.taken}"
            self.snapshots.add(sid)
            (paths.snapshots_dir / sid).mkdir(parents=True)
            manifest = {"unique_bytes": 20 << 20, "shared_bytes": 180 << 20, "capture": {"pause_ms": 20.0}}
            (paths.snapshots_dir / sid / "manifest.json").write_text(json.dumps(manifest))
            return {"id": sid}

        def delete_snapshot(self, snapshot_id: str) -> None:
            self.snapshots.remove(snapshot_id)

        def delete_sandbox(self, sandbox_id: str) -> None:
            self.sandboxes.remove(sandbox_id)

    fake = FakeApi()
    s = Samples()
    snapshot_sweep.dirty_sweep(cast(Api, fake), paths, s, Console(quiet=True), reps=3, clock=lambda: now[0])
    assert fake.made == 3 * len(snapshot_sweep.SWEEP_MIB) and not fake.sandboxes and not fake.snapshots
    assert fake.commands[0] == "dd if=/dev/urandom of=/dev/shm/sweep bs=1M count=16 status=none"
    assert [p["dirtied_mib"] for p in s.dirty_sweep] == [16.0, 64.0, 256.0]
    for point in s.dirty_sweep:
        first, again = point["snapshot_ms_samples"], point["snapshot_ms_again_samples"]
        assert len(first) == len(again) == 3 and len(point["pause_ms"]) == 6
        assert point["snapshot_ms"] == sorted(first)[1] and point["snapshot_ms_again"] == sorted(again)[1]
        assert point["snapshot_ms"] == 40.0 and point["snapshot_ms_again"] == 20.0  # p50 of 50/10/40 and 20/30/20
        assert (point["unique_mib"], point["shared_mib"]) == (20.0, 180.0)
