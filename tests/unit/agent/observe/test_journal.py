"""The agent's lines about a sandbox, told from what the sandbox service records: one line per change (state,
network policy, timeout, persistence), at the service's clock, and nothing when nothing changed."""

from __future__ import annotations

from pathlib import Path

from cryobox.agent.observe.journal import Journal, describe_policy
from cryobox.agent.observe.logbook import LogBook
from cryobox.agent.observe.rings import RingBounds
from cryobox.agentapi.models_obs import LogQuery
from cryobox.netpolicy import EgressPolicy
from tests.support.fake_vm import make_rig


def lines(book: LogBook, sandbox_id: str = "sb-1") -> list[str]:
    return [e.message for e in book.page(sandbox_id, LogQuery(limit=100)).entries]


async def test_every_recorded_change_is_one_line(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    book = LogBook(RingBounds(100, 1 << 16, 1 << 16))
    journal = Journal(book, rig.clock)
    rig.service.watch(journal.changed)
    await rig.service.create("base", sandbox_id="sb-1", ttl_s=60)
    await rig.service.pause("sb-1")
    await rig.service.resume("sb-1")
    await rig.service.set_network("sb-1", EgressPolicy(allow=["example.org", "10.0.0.0/8"], ports=[443]))
    await rig.service.set_lifecycle("sb-1", ttl_s=600)
    await rig.service.set_lifecycle("sb-1", ttl_s=600)  # no change: no line
    await rig.service.set_lifecycle("sb-1", persistent=True)
    await rig.service.hibernate("sb-1")
    await rig.service.wake("sb-1")
    said = lines(book)
    assert said[0].startswith("started: restored from template base in ") and said[0].endswith("(2 vCPU, 512 MiB)")
    assert said[1:] == [
        "paused: its vCPUs are stopped",
        "resumed",
        "network policy changed: default deny; allow example.org, 10.0.0.0/8; ports 443",
        "timeout set to 600 s of idleness",
        "made persistent: it never expires",
        "hibernated: memory and disk saved on the host, its VM stopped",
        "woken from hibernation",
    ]
    entries = book.page("sb-1", LogQuery()).entries
    assert {e.source for e in entries} == {"agent"} and entries[0].timestamp == rig.clock()
    journal.note("sb-1", "warn", "something else")
    assert book.page("sb-1", LogQuery(level="warn")).entries[0].message == "something else"


def test_policies_are_told_briefly() -> None:
    assert describe_policy(None) == "nothing allowed"
    many = EgressPolicy(default="allow", deny=[f"h{i}.example.org" for i in range(12)])
    assert describe_policy(many).endswith("h7.example.org and 4 more")
