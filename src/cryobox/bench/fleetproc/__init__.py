"""A whole cryobox fleet on one machine, as real processes: PostgreSQL, an S3 (moto), ``cryobox control`` and
N ``cryobox agent``, each agent in a network namespace of its own. For benchmarks and end-to-end tests (no pytest).

Modules, one concept each:

``addresses``  names and addresses of the agent namespaces, slot CIDRs, relayed ports (pure)
``netns``      :class:`AgentNetns` (namespace, veth pair, forward guard, relay) and :func:`reap_stale_netns`
``relay``      the loopback relay process (``python -m cryobox.bench.fleetproc.relay``; not imported here)
``postgres``   :class:`PostgresProcess`
``moto``       :class:`MotoProcess`, the S3 store
``procs``      :class:`ControlProcess` and :class:`AgentProcess`
``harness``    :class:`Fleet`, all of the above together
``system``     small OS helpers (commands, signals, threads entering a namespace)
"""

from __future__ import annotations

from .addresses import (
    AGENT_PORT,
    FLEET_NET,
    NetnsAddresses,
    check_name,
    fleet_addresses,
    link_names,
    loopback_ports,
    netns_name,
    parse_netns_name,
    pick_fleet_index,
    slot_cidrs,
)
from .harness import Fleet
from .moto import S3_CREDENTIALS, MotoProcess, parse_moto_endpoint, s3_store_url
from .netns import AgentNetns, guard_ruleset, reap_stale_netns
from .postgres import PostgresProcess, find_pg_bindir
from .procs import AgentProcess, ControlProcess, agents_by_name
from .system import socket_in_netns

__all__ = [
    "AGENT_PORT",
    "FLEET_NET",
    "S3_CREDENTIALS",
    "AgentNetns",
    "AgentProcess",
    "ControlProcess",
    "Fleet",
    "MotoProcess",
    "NetnsAddresses",
    "PostgresProcess",
    "agents_by_name",
    "check_name",
    "find_pg_bindir",
    "fleet_addresses",
    "guard_ruleset",
    "link_names",
    "loopback_ports",
    "netns_name",
    "parse_moto_endpoint",
    "parse_netns_name",
    "pick_fleet_index",
    "reap_stale_netns",
    "s3_store_url",
    "slot_cidrs",
    "socket_in_netns",
]
