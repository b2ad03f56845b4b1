"""Build records in the registry (``registry/builds.py``): heartbeats and the compare-and-set that fails a stale
build once, log lines by time in both directions with a minimum level."""

from __future__ import annotations

from cryobox.registry import Registry
from cryobox.registry.builds import BuildLogEntry, BuildRecord, BuildRecords
from tests.support import registry as registry_support

registry = registry_support.sqlite_registry


def records_with(registry: Registry, *, spec: dict[str, object] | None = None) -> BuildRecords:
    records = BuildRecords(registry.database)
    ws = registry.ensure_workspace("alpha").id
    records.add(BuildRecord("b1", "t", ws, "building", 10.0, spec=spec))
    return records


def test_a_stale_build_is_failed_once_at_its_last_step_and_a_late_heartbeat_does_not_revive_it(
    registry: Registry,
) -> None:
    records = records_with(registry, spec={"name": "t"})
    assert records.get("b1").updated_at == 10.0
    assert records.touch("b1", 20.0) and records.get("b1").updated_at == 20.0
    records.append_logs("b1", [BuildLogEntry(0, 11.0, "info", "x", "2"), BuildLogEntry(0, 12.0, "info", "y", "")])
    assert records.fail_stale("b1", before=20.0, error="gone", now=90.0) is None  # refreshed at 20: not before
    failed = records.fail_stale("b1", before=21.0, error="gone", now=90.0)
    assert failed is not None
    assert (failed.status, failed.error, failed.error_step, failed.finished_at) == ("error", "gone", "2", 90.0)
    assert records.fail_stale("b1", before=200.0, error="gone", now=95.0) is None  # already settled
    assert not records.touch("b1", 99.0)
    assert records.get("b1") == failed


def test_a_reservation_is_never_failed_as_stale(registry: Registry) -> None:
    records = records_with(registry, spec=None)
    assert records.fail_stale("b1", before=1e9, error="gone", now=1e9) is None
    assert records.get("b1").status == "building"


def test_log_lines_by_time_forward_and_backward_with_a_minimum_level(registry: Registry) -> None:
    records = records_with(registry)
    levels = ["debug", "info", "warn", "error", "info"]
    records.append_logs("b1", [BuildLogEntry(0, 100.0 + n, lvl, f"m{n}", "1") for n, lvl in enumerate(levels)])

    def messages(**kw: object) -> list[str]:
        return [e.message for e in records.logs_by_time("b1", **kw)]  # type: ignore[arg-type]

    assert messages(cursor=None, newest_first=False, limit=100) == ["m0", "m1", "m2", "m3", "m4"]
    assert messages(cursor=102.0, newest_first=False, limit=2) == ["m2", "m3"]
    assert messages(cursor=None, newest_first=True, limit=2) == ["m4", "m3"]
    assert messages(cursor=101.0, newest_first=True, limit=100) == ["m1", "m0"]
    assert messages(cursor=None, newest_first=False, limit=100, min_level="warn") == ["m2", "m3"]
    assert messages(cursor=None, newest_first=False, limit=0) == []
