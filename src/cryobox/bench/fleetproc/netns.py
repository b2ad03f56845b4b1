"""One agent's network namespace (:class:`AgentNetns`): veth pair, forward guard, loopback relay; and the reaping
of namespaces whose fleet died without tearing down (:func:`reap_stale_netns`).

Inside the namespace only ``lo`` and the connected /30 exist (addresses: :mod:`.addresses`): **no default route**
(nothing beyond the veth is even routable, whatever the root namespace's ``ip_forward`` says), and an nft table
``inet cbxfleet_<hex>`` in the root namespace drops anything forwarded from or to the veth (belt and braces: no
packet of the fleet can be routed off the machine). ``127.0.0.1:<port>`` inside reaches the root namespace's
loopback through a relay process (:mod:`.relay`).

Why ``nsenter --net`` (:meth:`AgentNetns.wrap`) and not ``ip netns exec``: the latter also gives the agent a
private mount namespace whose mounts are *slaves* of the host's, so the agent's own mounts (the per-sandbox
``/run/netns/*`` bind mounts, the memory server's FUSE mount, the data volume's loop mount) would not propagate
back: the host would see empty ``/run/netns`` files it cannot enter and could not clean anything up. ``nsenter
--net`` switches the network namespace only (then execs, so the agent keeps nsenter's PID); the agent's
per-sandbox namespaces, veths and nft table then live inside its namespace, and its mounts in the host's mount
namespace, exactly as for ``cryobox serve``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

from ...agent.net import firewall
from ...agent.net.slots import NETNS_DIR
from ...util.system import pid_alive
from ..childproc import stop_popen
from .addresses import (
    NETNS_PREFIX,
    NetnsAddresses,
    check_name,
    fleet_addresses,
    link_names,
    netns_name,
    parse_netns_name,
    pick_fleet_index,
)
from .system import die_with_parent, ipv4_in_use, kill_pid, run, socket_in_netns

TABLE_PREFIX = "cbxfleet_"
STATE_DIR = Path("/run/cbxfleet")
"""``<netns>.pid`` per live namespace (the creating process): :func:`reap_stale_netns` removes dead ones'."""
LOCK_PATH = STATE_DIR / "lock"
RELAY_MODULE = "cryobox.bench.fleetproc.relay"


def guard_ruleset(table: str, root_link: str) -> str:
    """The root-namespace table that forwards nothing from or to a fleet veth (loaded as one transaction)."""
    return f"""\
add table inet {table}
delete table inet {table}
table inet {table} {{
  chain forward {{
    type filter hook forward priority filter - 10; policy accept;
    iifname "{root_link}" drop
    oifname "{root_link}" drop
  }}
}}
"""


@contextlib.contextmanager
def _fleet_lock() -> Iterator[None]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_PATH, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


class AgentNetns:
    """One agent's network namespace, veth pair, forward guard and loopback relay; see the module doc.

    ``create()`` undoes what it did when a step fails; ``close()`` is idempotent and tolerates any half state.
    """

    def __init__(self, name: str, *, hex_id: str | None = None) -> None:
        self.label = check_name(name)
        self.hex = hex_id or secrets.token_hex(3)
        self.name = netns_name(name, self.hex)
        self.root_link, self.agent_link = link_names(self.hex)
        self.table = f"{TABLE_PREFIX}{self.hex}"
        self.addresses: NetnsAddresses | None = None
        self._relay: subprocess.Popen[bytes] | None = None
        self._relay_ports: tuple[int, ...] = ()
        self.log_dir: Path | None = None

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    @property
    def agent_ip(self) -> str:
        if self.addresses is None:
            raise RuntimeError(f"netns {self.name} not created")
        return self.addresses.agent_ip

    @property
    def root_ip(self) -> str:
        if self.addresses is None:
            raise RuntimeError(f"netns {self.name} not created")
        return self.addresses.root_ip

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in this namespace (network only; nsenter execs, so the PID stays the same)."""
        return ["nsenter", f"--net={self.path}", "--", *argv]

    def create(self) -> AgentNetns:
        try:
            with _fleet_lock():
                index = pick_fleet_index(ipv4_in_use())
                self.addresses = fleet_addresses(index)
                (STATE_DIR / f"{self.name}.pid").write_text(f"{os.getpid()}\n")
                run(["ip", "netns", "add", self.name])
                run(["ip", "link", "add", self.root_link, "type", "veth", "peer", "name", self.agent_link])
                run(["ip", "addr", "add", f"{self.root_ip}/{self.addresses.prefixlen}", "dev", self.root_link])
            run(["nft", "-f", "-"], stdin=guard_ruleset(self.table, self.root_link))
            run(["ip", "link", "set", self.agent_link, "netns", self.name])
            run(["ip", "link", "set", self.root_link, "up"])
            inside = ["ip", "-n", self.name]
            run([*inside, "link", "set", "lo", "up"])
            run([*inside, "addr", "add", f"{self.agent_ip}/{self.addresses.prefixlen}", "dev", self.agent_link])
            run([*inside, "link", "set", self.agent_link, "up"])
            # deliberately no default route: only the connected /30 is routable from inside
        except BaseException:
            self.close()
            raise
        return self

    def forward_loopback(self, ports: Iterable[int], *, timeout_s: float = 10.0) -> None:
        """Make ``127.0.0.1:<port>`` inside the namespace reach ``127.0.0.1:<port>`` of the root namespace, for
        each port (a relay process; replaced when the set of ports changes, kept when it is the same)."""
        wanted = tuple(sorted(set(ports)))
        if self._relay is not None and self._relay.poll() is None and wanted == self._relay_ports:
            return
        self._stop_relay()
        if not wanted:
            return
        log_path = (self.log_dir or Path(tempfile.gettempdir())) / f"relay-{self.name}.log"
        with open(log_path, "ab") as log:
            self._relay = subprocess.Popen(
                [sys.executable, "-m", RELAY_MODULE, str(self.path), *map(str, wanted)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                preexec_fn=die_with_parent,
            )
        self._relay_ports = wanted
        assert self._relay.stdout is not None
        ready, _, _ = select.select([self._relay.stdout], [], [], timeout_s)
        line = self._relay.stdout.readline() if ready else b""
        if line.strip() != b"ready":
            self._stop_relay()
            raise RuntimeError(f"relay for {self.name} did not come up; see {log_path}")

    def _stop_relay(self) -> None:
        if self._relay is not None:
            stop_popen(self._relay, signal.SIGKILL, 5.0)
            if self._relay.stdout is not None:
                self._relay.stdout.close()
        self._relay, self._relay_ports = None, ()

    def pids(self) -> list[int]:
        """Processes whose network namespace is this one (an agent, its memory server, QEMUs it left)."""
        if not self.path.exists():
            return []
        out = run(["ip", "netns", "pids", self.name], check=False)
        return [int(p) for p in out.split() if p.isdigit()]

    def close(self) -> None:
        self._stop_relay()
        for pid in self.pids():
            kill_pid(pid)
        run(["nft", "delete", "table", "inet", self.table], check=False)
        run(["ip", "link", "del", self.root_link], check=False)  # takes the peer with it
        if self.path.exists():
            run(["ip", "netns", "del", self.name], check=False)
        (STATE_DIR / f"{self.name}.pid").unlink(missing_ok=True)
        # the routing record its (killed) agent kept for the namespace: nothing else would remove it
        firewall.prune_records(firewall.STATE_DIR, firewall.live_netns())

    # -- checks --------------------------------------------------------------------------------------------------

    def routes_inside(self) -> list[str]:
        return [line.strip() for line in run(["ip", "-n", self.name, "-4", "route", "show"]).splitlines() if line]

    def routable_from_inside(self, address: str) -> bool:
        """Whether the namespace has a route to ``address`` (a routing-table lookup: sends nothing)."""
        return subprocess.run(["ip", "-n", self.name, "route", "get", address], capture_output=True).returncode == 0

    def connects_from_inside(self, host: str, port: int, timeout_s: float = 2.0) -> bool:
        """A TCP connect from inside the namespace (to be used on this machine's own addresses only)."""
        sock = socket_in_netns(self.path)
        sock.settimeout(timeout_s)
        try:
            sock.connect((host, port))
        except OSError:
            return False
        finally:
            sock.close()
        return True

    def __enter__(self) -> AgentNetns:
        return self.create()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def reap_stale_netns() -> list[str]:
    """Remove the namespaces, veths and guard tables of fleets whose process died without tearing down."""
    removed: list[str] = []
    if not STATE_DIR.exists():
        return removed
    for marker in STATE_DIR.glob(f"{NETNS_PREFIX}*.pid"):
        try:
            owner = int(marker.read_text().strip())
        except (OSError, ValueError):
            owner = 0
        if owner and pid_alive(owner):
            continue
        name = marker.name.removesuffix(".pid")
        parsed = parse_netns_name(name)
        if parsed is None:
            marker.unlink(missing_ok=True)
            continue
        AgentNetns(parsed[0], hex_id=parsed[1]).close()
        removed.append(name)
    return removed
