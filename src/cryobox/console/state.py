"""The console's parts of one app: the metrics sampler and bisect jobs (the exec history is the control plane's:
:mod:`cryobox.server.execlog`)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from .bisect_jobs import BisectJobs
from .sampler import MetricsSampler


@dataclass
class ConsoleState:
    sampler: MetricsSampler
    bisects: BisectJobs


def console_state(request: Request) -> ConsoleState:
    """The console's parts of the app serving ``request`` (kept on ``app.state.console``)."""
    state: ConsoleState = request.app.state.console
    return state
