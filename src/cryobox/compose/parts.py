"""Putting the parts together: a host agent (``serve``, ``agent``) and a control plane (``serve``, ``control``).

The CLI is the one place that knows both sides; each side only sees the other through
:class:`cryobox.agentapi.Agent`.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..agent.host.recipes import recipe_services
from ..agent.host.startup import Host, HostConfig, prepare_template, start_host
from ..agent.host.stopmode import OnStop
from ..agent.hostagent.agent import HostAgent
from ..agent.hostagent.metrics import AgentMetrics
from ..agent.sandbox.admission import AdmissionConfig, AdmissionController
from ..agent.templates.buildvm import BuildQueue
from ..agentapi import Agent
from ..errors import InvalidArgument
from ..objstore.client import ObjectStore
from ..registry import Registry
from ..server.control.fleet import DEFAULT_DEADLINE_S, Fleet, FleetConfig
from ..server.control.ownership import StoreOwnership
from ..server.control.placement import DEFAULT_RESERVATION_TTL_S, Placement
from ..server.control.quotas import QuotaGuard
from ..server.control.sandboxes import ControlPlane
from ..server.control.snapshots import RetentionPolicy, SnapshotControl
from ..server.control.templates import TemplateJobs
from ..server.metrics import Metrics
from ..util.envvars import positive_seconds
from ..util.proc import Progress

NODE_TOKEN_ENV = "CRYOBOX_NODE_TOKEN"
DEADLINE_ENV = "CRYOBOX_AGENT_DEADLINE_S"
ON_STOP_ENV = "CRYOBOX_ON_STOP"
RESERVATION_TTL_ENV = "CRYOBOX_RESERVATION_TTL_S"
GRACEFUL_STOP_S = 3
"""How long a stopping server waits for open requests and streams before it closes them (``keep`` then leaves
every VM running, so an agent exits within seconds whatever the load)."""


def on_stop_mode(value: str | None, env: dict[str, str] | None = None) -> OnStop:
    """``--on-stop`` (or ``CRYOBOX_ON_STOP``): keep (default), hibernate or kill."""
    raw = value or (os.environ if env is None else env).get(ON_STOP_ENV, "") or OnStop.KEEP.value
    try:
        return OnStop(raw)
    except ValueError:
        choices = ", ".join(m.value for m in OnStop)
        raise InvalidArgument(f"--on-stop must be one of {choices}, not {raw!r}") from None


@dataclass(frozen=True)
class AgentOptions:
    name: str
    url: str = ""
    memory_mib: int | None = None
    vcpus: int | None = None
    max_sandboxes: int = 256


async def boot_agent(
    config: HostConfig,
    admission_config: AdmissionConfig,
    options: AgentOptions,
    progress: Progress,
) -> tuple[Host, HostAgent]:
    """Start the host (reclaim, images, templates, pools, memory server) and its agent."""
    host = await start_host(config, progress)
    metrics = AgentMetrics()
    admission = AdmissionController(admission_config, observer=metrics)

    agent = HostAgent(
        host,
        admission,
        name=options.name,
        url=options.url,
        memory_mib=options.memory_mib,
        vcpus=options.vcpus,
        max_sandboxes=options.max_sandboxes,
        builder=functools.partial(prepare_template, config, queue=BuildQueue.from_env(), recipe=recipe_services(host)),
        metrics_sources=[metrics.text],
        isolation="tcg" if config.accel.value == "tcg" else "kvm",
    )
    return host, agent


def fleet_config(env: dict[str, str] | None = None, deadline_s: float | None = None) -> FleetConfig:
    environ = os.environ if env is None else env
    raw = environ.get(DEADLINE_ENV, "")
    deadline = deadline_s if deadline_s is not None else float(raw) if raw else DEFAULT_DEADLINE_S
    return FleetConfig(deadline_s=deadline, node_token=environ.get(NODE_TOKEN_ENV, ""))


def reservation_ttl_s(env: dict[str, str] | None = None) -> float:
    """How long a reservation holds room without its row (``CRYOBOX_RESERVATION_TTL_S``, default 60 s): the
    longest a create may take from placement to its row, and how long a dead replica's strays live."""
    return positive_seconds(os.environ if env is None else env, RESERVATION_TTL_ENV, DEFAULT_RESERVATION_TTL_S)


def build_control(
    registry: Registry,
    config: FleetConfig,
    retention: RetentionPolicy,
    objects: ObjectStore | None,
    metrics: Metrics,
    local: dict[str, Agent] | None = None,
    *,
    clock: Callable[[], float] = time.time,
    quotas: QuotaGuard | None = None,
    machine: str | None = None,
) -> ControlPlane:
    """The control plane over ``registry``: the fleet (with ``local`` agents in this process), placement,
    snapshots and template jobs, all on one wall ``clock``; ``quotas`` ``None``: the limits from the environment
    (``CRYOBOX_QUOTA_*``); ``machine`` ``None``: ``/etc/machine-id``. The registry is announced in ``objects``
    (:mod:`~cryobox.server.control.ownership`). The CLI passes neither ``clock`` nor ``quotas``; the tests assemble
    the same way with a fake clock or given limits."""
    fleet = Fleet(registry, config, clock=clock, local=dict(local or {}))
    owners = StoreOwnership.announced(objects, registry, machine) if objects is not None else None
    control = ControlPlane(
        fleet,
        registry,
        Placement(registry, deadline_s=config.deadline_s, ttl_s=reservation_ttl_s(), clock=clock),
        metrics,
        SnapshotControl(registry, fleet, clock, retention, objects=objects, owners=owners),
        TemplateJobs(registry, fleet),
        quotas=quotas,
    )
    control.templates.owners = owners
    return control
