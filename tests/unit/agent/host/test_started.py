"""A failed start undoes what it brought up: the host table's load, running beside the later steps, is waited for
before the table is removed (a removal racing it would leave the table behind), and its own failure is not raised
again by the undo."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, cast

import pytest

from cryobox.agent.host.started import Started


class SlowFirewall:
    def __init__(self, fail: bool = False) -> None:
        self.release = threading.Event()
        self.events: list[str] = []
        self.fail = fail

    def ensure(self) -> None:
        self.release.wait(5)
        self.events.append("loaded")
        if self.fail:
            raise RuntimeError("nft failed")

    def remove(self) -> None:
        self.events.append("removed")


@pytest.mark.parametrize("fail", [False, True])
async def test_the_undo_waits_for_the_table_load_then_removes_it(tmp_path: Path, fail: bool) -> None:
    firewall = SlowFirewall(fail)
    started = Started(firewall=cast(Any, firewall))
    started.firewalling = asyncio.ensure_future(asyncio.to_thread(firewall.ensure))
    undoing = asyncio.create_task(started.undo(tmp_path))
    await asyncio.sleep(0.1)
    assert firewall.events == [] and not undoing.done()  # still loading: nothing removed yet
    firewall.release.set()
    await asyncio.wait_for(undoing, 5)
    assert firewall.events == ["loaded", "removed"]
