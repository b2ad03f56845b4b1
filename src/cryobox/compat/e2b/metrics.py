"""``GET /sandboxes/{id}/metrics`` for the E2B SDK's ``get_metrics``: one sample taken now, inside the guest.

cryobox keeps no per-sandbox time series, so the answer is a single ``SandboxMetric`` measured when asked: CPU
use over a 200 ms window (two readings of ``/proc/stat``), memory from ``/proc/meminfo`` and the root file
system's size and use (``df``), all from one command in the guest.
"""

from __future__ import annotations

import time
from typing import Any

from ...agentapi import models as am
from ...agentapi.interface import Agent
from ...errors import GuestError
from ...util.times import rfc3339

SAMPLE = (
    "head -1 /proc/stat; grep -E '^(MemTotal|MemAvailable|Cached):' /proc/meminfo; "
    "df -B1 --output=size,used / | tail -1; sleep 0.2; head -1 /proc/stat"
)


def _cpu(line: str) -> tuple[int, int]:
    """(busy, total) jiffies of a ``cpu`` line of ``/proc/stat``."""
    values = [int(v) for v in line.split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def parse_sample(text: str, cpus: int, now: float) -> dict[str, Any]:
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        (busy0, total0), (busy1, total1) = _cpu(lines[0]), _cpu(lines[-1])
        mem = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines[1:4]}
        disk_total, disk_used = (int(v) for v in lines[4].split())
    except (IndexError, ValueError) as err:
        raise GuestError(f"unexpected metrics sample from the guest: {err}") from err
    pct = 100.0 * (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0
    return {
        "timestamp": rfc3339(now),
        "timestampUnix": int(now),
        "cpuCount": cpus,
        "cpuUsedPct": round(pct, 2),
        "memUsed": mem["MemTotal"] - mem["MemAvailable"],
        "memTotal": mem["MemTotal"],
        "memCache": mem.get("Cached", 0),
        "diskUsed": disk_used,
        "diskTotal": disk_total,
    }


async def sample(agent: Agent, sandbox_id: str, cpus: int) -> dict[str, Any]:
    result = await agent.exec(sandbox_id, am.ExecRequest(cmd=SAMPLE, timeout_s=10))
    if result.exit_code != 0:
        raise GuestError(f"metrics sample failed in the guest: {result.stderr.strip()}")
    return parse_sample(result.stdout, cpus, time.time())
