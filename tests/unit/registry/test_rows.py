"""Network policies in registry rows (``SandboxRow.egress``, ``SnapshotRow.egress``): stored as their JSON mapping,
read back as the same policy; a list of CIDRs written by an older version reads as a policy allowing exactly it."""

from __future__ import annotations

from sqlalchemy import update

from cryobox.netpolicy import EgressPolicy
from cryobox.registry import Registry
from cryobox.registry import models as m
from tests.support import registry as registry_support
from tests.support.registry import sandbox, snapshot

pg_server = registry_support.pg_server
db_url = registry_support.db_url
registry = registry_support.registry

POLICY = EgressPolicy(
    default="deny",
    allow=["203.0.113.0/24", "*.example.org"],
    deny=["bad.example.org"],
    ports=[443],
    public_traffic=False,
    mask_request_host="${PORT}-app.example.org",
)


def _raw(registry: Registry, table: type[m.Base], row_id: str, value: object) -> None:
    with registry.database.session(what="test") as s:
        s.execute(update(table).where(table.id == row_id).values(egress=value))  # type: ignore[attr-defined]


def test_a_policy_round_trips_through_sandbox_and_snapshot_rows(registry: Registry) -> None:
    ws = registry.ensure_workspace("w").id
    registry.add_sandbox(sandbox("sb-1", ws, egress=POLICY))
    assert registry.get_sandbox("sb-1").egress == POLICY
    opened = EgressPolicy(default="allow")
    assert registry.update_sandbox("sb-1", egress=opened).egress == opened
    assert registry.update_sandbox("sb-1", egress=None).egress is None
    registry.add_snapshot(snapshot("snap-1", ws, sandbox_id="sb-1", egress=POLICY))
    assert registry.get_snapshot("snap-1").egress == POLICY
    registry.add_snapshot(snapshot("snap-2", ws))
    assert registry.get_snapshot("snap-2").egress is None


def test_a_stored_list_of_cidrs_reads_as_a_policy_allowing_exactly_it(registry: Registry) -> None:
    ws = registry.ensure_workspace("w").id
    registry.add_sandbox(sandbox("sb-old", ws))
    _raw(registry, m.Sandbox, "sb-old", ["0.0.0.0/0"])
    assert registry.get_sandbox("sb-old").egress == EgressPolicy(default="deny", allow=["0.0.0.0/0"])
    _raw(registry, m.Sandbox, "sb-old", {"default": "allow", "frobnicate": 1})  # not a policy: nothing allowed
    assert registry.get_sandbox("sb-old").egress is None
    assert [r.id for r in registry.list_sandboxes(ws)] == ["sb-old"]  # and every read still works
