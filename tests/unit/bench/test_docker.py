"""``cryobox bench docker``'s result from samples, and the bake's sizes read from a template directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cryobox.bench.docker import bake_sizes, build_result
from cryobox.bench.snapshot_report import BenchError


def test_build_result_reports_each_figure_and_the_container_cost() -> None:
    samples = {
        "create": [90.0, 100.0, 110.0],
        "ps": [40.0, 50.0, 60.0],
        "restore_create": [300.0, 310.0, 320.0],
        "first_run": [900.0, 1000.0, 1100.0],
        "create_to_run": [1200.0, 1310.0, 1420.0],
        "steady_run": [600.0] * 6,
        "exec": [30.0] * 6,
    }
    guest = {"memory_used_mib": 180.44, "disk_used_mib": 1200.0, "var_lib_docker_mib": 3.0}
    bake = {"memory_file_mib": 433.0}
    result = build_result({"samples": samples, "guest": guest}, n=3, qemu="7.2.0", memory_mb=1024, bake=bake)
    assert result["create_ms"]["p50"] == 100.0 and result["first_docker_ps_ms"]["p50"] == 50.0
    assert result["create_to_docker_run_ms"]["p50"] == 1310.0
    assert result["restore_create_ms"]["p50"] == 310.0 and result["first_docker_run_ms"]["p50"] == 1000.0
    assert result["container_over_exec"] == 20.0
    assert result["template_memory_mb"] == 1024 and result["bake"] == bake
    assert result["guest_after_create"]["memory_used_mib"] == 180.4


def test_bake_sizes_reads_allocated_and_apparent_sizes(tmp_path: Path) -> None:
    rootfs = tmp_path / "images" / "rootfs.ext4"
    rootfs.parent.mkdir()
    with open(rootfs, "wb") as fh:  # sparse: 64 MiB apparent, 1 MiB written
        fh.write(b"x" * (1 << 20))
        fh.truncate(64 << 20)
    bake = tmp_path / "templates" / "docker-abc"
    bake.mkdir(parents=True)
    (bake / "manifest.json").write_text(json.dumps({"rootfs": str(rootfs)}))
    (bake / "memory").write_bytes(b"m" * (2 << 20))
    (bake / "disk.qcow2").write_bytes(b"d" * (1 << 20))
    sizes = bake_sizes(tmp_path, "abc")
    assert sizes["memory_file_mib"] == 2.0 and sizes["memory_file_apparent_mib"] == 2.0
    assert sizes["disk_overlay_mib"] == 1.0
    assert sizes["rootfs_apparent_mib"] == 64.0 and sizes["rootfs_mib"] < 2.0


def test_bake_sizes_refuses_a_missing_bake(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="no bake"):
        bake_sizes(tmp_path, "nope")
