"""A pool VM's login-shell warm-up: started as E2B's SDKs start a command, and forgotten by the guest when it
ends (so the sandbox the VM becomes lists no process); a guest that cannot run it leaves the VM cold, not broken."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

from cryobox.agent.guest.client import GuestClient
from cryobox.agent.sandbox.poolwarm import warm_login_shell
from cryobox.errors import GuestError


class StubGuest:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.streams: list[tuple[str, dict[str, Any]]] = []
        self.drained = False

    async def stream(self, op: str, args: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        self.streams.append((op, args))
        if self.fail:
            raise GuestError("no such user: user")
        yield {"event": "start", "data": "42"}
        yield {"event": "result", "result": {"pid": 42, "exit_code": 0, "exited": True}}
        self.drained = True


async def test_the_login_shell_runs_attached_as_user_and_is_forgotten() -> None:
    guest = StubGuest()
    await warm_login_shell(cast(GuestClient, guest))
    [(op, args)] = guest.streams
    assert op == "proc_start" and args["cmd"] == "/bin/bash" and args["args"] == ["-l", "-c", "true"]
    assert args["attach"] is True and args["forget"] is True and args["default_user"] == "user"
    assert guest.drained  # followed to its end (a stream left early would detach it: listed, running on)


async def test_a_guest_that_cannot_run_it_leaves_the_vm_cold_not_broken() -> None:
    guest = StubGuest(fail=True)
    await warm_login_shell(cast(GuestClient, guest))  # no exception: the warm-up goes on
    assert len(guest.streams) == 1
