"""The console's parts of one app: the metrics sampler, exec history and bisect jobs."""

from __future__ import annotations

from dataclasses import dataclass

from .bisect_jobs import BisectJobs
from .execs import ExecHistory
from .sampler import MetricsSampler


@dataclass
class ConsoleState:
    sampler: MetricsSampler
    bisects: BisectJobs
    execs: ExecHistory
