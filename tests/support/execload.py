"""A steady exec load on sandboxes of a server, for tests that restart or upgrade it underneath: each thread
execs ``echo N`` in a loop, one connection per request, recording when each started and ended and whether it
answered as it should."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx


@dataclass
class Call:
    started: float
    ended: float
    error: str | None


def _load(url: str, key: str, sandbox_id: str, stop: threading.Event, calls: list[Call]) -> None:
    """Exec ``echo`` in a loop, one connection per request (a keep-alive connection the old process closes while
    idle is the client's to reopen; what is tested is that no *new* connection is refused or dropped)."""
    headers = {"Authorization": f"Bearer {key}", "Connection": "close"}
    n = 0
    while not stop.is_set():
        n += 1
        started = time.monotonic()
        error = None
        try:
            response = httpx.post(
                f"{url}/v1/sandboxes/{sandbox_id}/exec", json={"cmd": f"echo {n}"}, headers=headers, timeout=120
            )
            if response.status_code != 200 or response.json()["stdout"] != f"{n}\n":
                error = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as err:
            error = repr(err)
        calls.append(Call(started, time.monotonic(), error))


def start_load(
    url: str, key: str, sandboxes: list[str], stop: threading.Event, calls: list[Call]
) -> list[threading.Thread]:
    """One load thread per sandbox, started; they run until ``stop`` is set."""
    workers = [threading.Thread(target=_load, args=(url, key, sid, stop, calls), daemon=True) for sid in sandboxes]
    for worker in workers:
        worker.start()
    return workers


def end_load(stop: threading.Event, workers: list[threading.Thread], calls: list[Call], before: int) -> None:
    """Stop the load and judge it: no request failed, and at least two ran before ``before`` was counted and two
    after (idempotent: also the tests' clean-up)."""
    stop.set()
    for worker in workers:
        worker.join(timeout=150)
    failed = [call for call in calls if call.error is not None]
    assert not failed, f"{len(failed)} of {len(calls)} requests failed: {failed[:3]}"
    assert before >= 2 and len(calls) - before >= 2, (before, len(calls))
