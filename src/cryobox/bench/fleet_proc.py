"""A whole cryobox fleet on one machine, as real processes: PostgreSQL, an S3 (moto), ``cryobox control`` and
N ``cryobox agent``, each agent in a network namespace of its own. For benchmarks and end-to-end tests (no pytest).

Addresses. Agent ``k`` gets namespace ``cbxfleet-<name>-<hex>`` and a veth pair ``fl<hex>r`` (root namespace,
``10.250.<i>.1/30``) / ``fl<hex>a`` (agent namespace, ``10.250.<i>.2/30``), ``i`` being the first index whose /24
no address or route of the root namespace touches (allocated under a lock file, so concurrent fleets on the machine
never collide). The agent listens on ``10.250.<i>.2:AGENT_PORT`` and advertises that URL: the control plane (root
namespace) calls it over the veth. Inside the namespace only ``lo`` and the connected /30 exist: **no default
route** (nothing beyond the veth is even routable, whatever the root namespace's ``ip_forward`` says), and an nft
table ``inet cbxfleet_<hex>`` in the root namespace drops anything forwarded from or to the veth (belt and braces:
no packet of the fleet can be routed off the machine).

Reaching the control plane and the store. Both listen on ``127.0.0.1`` of the root namespace only. A relay process
(``python -m cryobox.bench.fleet_proc relay``, one per agent namespace) opens listening sockets *inside* the agent's
namespace on ``127.0.0.1:<the same port>`` (a socket belongs to the namespace of the thread that created it: a
short-lived thread ``setns``-es there, binds, and exits) and forwards each connection to ``127.0.0.1:<port>`` of
the root namespace. So every agent is given exactly the URLs the root namespace uses (``--control
http://127.0.0.1:P``, ``--store s3://B?endpoint=http://127.0.0.1:M``): the store's canonical identity (its URL, see
:mod:`cryobox.agent.store.objstore`) is the same on every host and in the control plane, nothing listens on a
non-loopback address of the machine, and the only non-loopback traffic is control plane -> ``10.250.<i>.2`` over
the veth pairs created here.

Why ``nsenter --net`` and not ``ip netns exec``: the latter also gives the agent a private mount namespace whose
mounts are *slaves* of the host's, so the agent's own mounts (the per-sandbox ``/run/netns/*`` bind mounts, the
memory server's FUSE mount, the data volume's loop mount) would not propagate back: the host would see empty
``/run/netns`` files it cannot enter and could not clean anything up. ``nsenter --net`` switches the network
namespace only (then execs, so the agent keeps nsenter's PID); the agent's per-sandbox namespaces, veths and nft
table then live inside its namespace, and its mounts in the host's mount namespace, exactly as for ``cryobox serve``.

``isolation="loopback"`` (``netns=None`` for an :class:`AgentProcess`) is the fallback: every agent on
``127.0.0.1:<free port>`` of the root namespace, with distinct slot CIDRs.

Children that must not outlive the harness (moto, the relays) get ``PR_SET_PDEATHSIG``; note that it fires when the
*thread* that spawned them ends, so start a :class:`Fleet` from a thread that lives as long as it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import ipaddress
import json
import os
import pwd
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs, quote, urlsplit

import httpx

from ..agent.net.slots import CIDR_ENV, NETNS_DIR, pick_cidr, tag_for
from ..agent.reclaim import find_own_qemus
from ..agent.store.mounts import unmount
from ..agent.store.volume import release_volume
from ..config import DEFAULT_CACHE_DIR, Paths
from .server import ServeProcess, free_port

T = TypeVar("T")

FLEET_NET = ipaddress.IPv4Network("10.250.0.0/16")
NETNS_PREFIX = "cbxfleet-"
LINK_PREFIX = "fl"
TABLE_PREFIX = "cbxfleet_"
AGENT_PORT = 7480
"""The port every namespaced agent listens on (each namespace has its own address, so one port serves all)."""
STATE_DIR = Path("/run/cbxfleet")
"""``<netns>.pid`` per live namespace (the creating process): :func:`reap_stale_netns` removes dead ones'."""
LOCK_PATH = STATE_DIR / "lock"
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
REGION = "us-east-1"
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
PG_ROOT = Path("/usr/lib/postgresql")
PG_SOCKET_PORT = 5432
"""Only names the socket file ``.s.PGSQL.5432`` in the server's private socket directory (no TCP listener)."""
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,19}$")
_MOTO_RUNNING = re.compile(r"Running on http://(\d+\.\d+\.\d+\.\d+):(\d+)")
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost"})


# -- pure parts (unit-tested) ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NetnsAddresses:
    """The /30 of fleet index ``index`` (1..254): ``.1`` on the root end of the veth, ``.2`` in the namespace."""

    index: int
    network: ipaddress.IPv4Network
    root_ip: str
    agent_ip: str

    @property
    def prefixlen(self) -> int:
        return self.network.prefixlen


def fleet_addresses(index: int) -> NetnsAddresses:
    if not 1 <= index <= 254:
        raise ValueError(f"fleet index must be in 1..254, got {index}")
    network = ipaddress.IPv4Network(f"10.250.{index}.0/30")
    return NetnsAddresses(index, network, str(network.network_address + 1), str(network.network_address + 2))


def pick_fleet_index(used: Iterable[ipaddress.IPv4Network], exclude: Collection[int] = ()) -> int:
    """The first index whose ``10.250.<i>.0/24`` overlaps none of ``used`` (the root namespace's addresses and
    routes; a default route is not an overlap)."""
    taken = [net for net in used if net.prefixlen > 0]
    for index in range(1, 255):
        block = ipaddress.IPv4Network(f"10.250.{index}.0/24")
        if index not in exclude and not any(block.overlaps(net) for net in taken):
            return index
    raise RuntimeError("no free 10.250.<i>.0/24 for a fleet namespace")


def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise ValueError(f"agent name must match {_NAME_RE.pattern}, got {name!r}")
    return name


def netns_name(name: str, hex_id: str) -> str:
    return f"{NETNS_PREFIX}{check_name(name)}-{hex_id}"


def parse_netns_name(name: str) -> tuple[str, str] | None:
    """``cbxfleet-<name>-<hex6>`` -> (name, hex6); ``None`` for any other name."""
    match = re.fullmatch(rf"{NETNS_PREFIX}([a-z0-9][a-z0-9-]{{0,19}})-([0-9a-f]{{6}})", name)
    return (match.group(1), match.group(2)) if match else None


def link_names(hex_id: str) -> tuple[str, str]:
    """(root end, agent end): ``fl<hex6>r`` / ``fl<hex6>a``, 9 bytes (IFNAMSIZ allows 15). Not ``cb*``: agents
    treat ``cb*`` links as their sandboxes' slots."""
    return f"{LINK_PREFIX}{hex_id}r", f"{LINK_PREFIX}{hex_id}a"


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


def parse_moto_endpoint(log_text: str, host: str = "127.0.0.1") -> str | None:
    """``http://<host>:<port>`` from moto's (werkzeug's) "Running on http://A:P" line for ``host``, if printed."""
    for match in _MOTO_RUNNING.finditer(log_text):
        if match.group(1) == host:
            return f"http://{host}:{int(match.group(2))}"
    return None


def s3_store_url(bucket: str, endpoint: str, region: str = REGION) -> str:
    return f"s3://{bucket}?endpoint={endpoint}&region={region}"


def loopback_ports(urls: Iterable[str]) -> list[int]:
    """Ports of the loopback endpoints among ``urls`` (``http://127.0.0.1:P``, or an ``s3://…?endpoint=`` one):
    what a namespaced agent needs relayed to the root namespace. Sorted, without duplicates."""
    ports: set[int] = set()
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme == "s3":
            endpoint = parse_qs(parts.query).get("endpoint", [""])[0]
            if not endpoint:
                continue
            parts = urlsplit(endpoint)
        if parts.hostname in _LOOPBACK_HOSTS:
            ports.add(parts.port or (443 if parts.scheme == "https" else 80))
    return sorted(ports)


def slot_cidrs(count: int, taken: Iterable[ipaddress.IPv4Network] = ()) -> list[str]:
    """``count`` distinct ``10.N.0.0/16`` slot CIDRs (``CRYOBOX_NET_CIDR`` of each agent), overlapping none of
    ``taken`` nor the fleet's own 10.250.0.0/16."""
    used = [*taken, FLEET_NET]
    out = []
    for _ in range(count):
        cidr = pick_cidr(used)
        out.append(cidr)
        used.append(ipaddress.IPv4Network(cidr))
    return out


def agents_by_name(payload: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``GET /v1/agents`` -> {name: agent}."""
    return {str(a["name"]): dict(a) for a in payload.get("agents", []) if isinstance(a, Mapping) and "name" in a}


# -- small process helpers -------------------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In a child (preexec_fn): SIGKILL me when the thread that spawned me dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True, timeout: float = 60.0) -> str:
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return proc.stdout


def _stop_popen(proc: subprocess.Popen[bytes] | None, sig: int, timeout_s: float) -> int | None:
    if proc is None:
        return None
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _in_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` on a brand-new thread that ends afterwards (it may leave that thread in another netns)."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # re-raised on the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name="cbxfleet-netns", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _setns(path: Path) -> None:
    """Move the *calling thread* into the network namespace at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def socket_in_netns(path: Path, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket that belongs to the network namespace at ``path`` (usable from any thread afterwards)."""

    def make() -> socket.socket:
        _setns(path)
        return socket.socket(family, kind)

    return _in_thread(make)


def _ipv4_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 address (as its network) and route of the root namespace."""
    out: list[ipaddress.IPv4Network] = []
    for link in json.loads(_run(["ip", "-j", "-4", "addr", "show"]) or "[]"):
        for addr in link.get("addr_info", []):
            with contextlib.suppress(KeyError, ValueError):
                out.append(ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    for route in json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                out.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -- PostgreSQL ------------------------------------------------------------------------------------------------------


def find_pg_bindir() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding initdb and pg_ctl."""

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", path.parent.name))

    candidates = [p.parent for p in PG_ROOT.glob("*/bin/initdb") if (p.parent / "pg_ctl").exists()]
    if not candidates:
        raise RuntimeError(f"PostgreSQL server binaries (initdb, pg_ctl) not found under {PG_ROOT}/*/bin")
    return max(candidates, key=version)


class PostgresProcess:
    """A throwaway PostgreSQL cluster on a unix socket only (``listen_addresses=''``), in a temporary directory.

    As root the binaries run as the ``postgres`` user (``runuser``). ``url`` is a SQLAlchemy/psycopg URL for
    database ``database`` (created at start). ``stop()`` is ``pg_ctl -m immediate`` then rmtree; idempotent.
    """

    def __init__(self, *, database: str = "cryobox", start_timeout_s: float = 60.0) -> None:
        self.database = database
        self.start_timeout_s = start_timeout_s
        self.root: Path | None = None
        self._bindir: Path | None = None
        self._started = False

    @property
    def socket_dir(self) -> Path:
        if self.root is None:
            raise RuntimeError("PostgresProcess not started")
        return self.root

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@/{quote(self.database)}?host={self.socket_dir}&port={PG_SOCKET_PORT}"

    def _as_postgres(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def _pg(self, argv: list[str], what: str, timeout: float = 120.0) -> None:
        proc = subprocess.run(
            self._as_postgres(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{what} failed ({proc.returncode}): {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")

    def start(self) -> PostgresProcess:
        bindir = self._bindir = find_pg_bindir()
        # short: unix socket paths are limited to 107 bytes
        root = self.root = Path(tempfile.mkdtemp(prefix="cbxpg-", dir="/tmp"))
        data, log = root / "data", root / "postgres.log"
        try:
            if os.geteuid() == 0:
                try:
                    owner = pwd.getpwnam("postgres")
                except KeyError:
                    raise RuntimeError("running as root needs the 'postgres' system user") from None
                os.chown(root, owner.pw_uid, owner.pw_gid)
            self._pg(
                [str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"]
                + ["--locale=C", "--no-sync"],
                "initdb",
            )
            options = (
                f"-k {root} -p {PG_SOCKET_PORT} -c listen_addresses='' "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            self._started = True  # from here on a server may be running, whatever pg_ctl says
            timeout = int(self.start_timeout_s)
            try:
                self._pg(
                    [str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options]
                    + ["-w", "-t", str(timeout), "start"],
                    "pg_ctl start",
                    timeout=timeout + 30,
                )
            except RuntimeError as err:
                server_log = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
                raise RuntimeError(f"{err}\n{server_log}") from None
            if self.database != "postgres":
                self._pg(
                    [str(bindir / "createdb"), "-h", str(root), "-p", str(PG_SOCKET_PORT), "-U", "postgres"]
                    + [self.database],
                    "createdb",
                )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        root, bindir = self.root, self._bindir
        if root is None:
            return
        if self._started and bindir is not None:
            data = root / "data"
            try:
                self._pg([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], "pg_ctl stop", 60)
            except (RuntimeError, subprocess.TimeoutExpired):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    _kill_pid(int((data / "postmaster.pid").read_text().splitlines()[0]))
            self._started = False
        shutil.rmtree(root, ignore_errors=True)
        self.root = None

    def __enter__(self) -> PostgresProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- S3 (moto) -------------------------------------------------------------------------------------------------------


class MotoProcess:
    """``python -m moto.server -H <host> -p 0``; the port is read back from its log. Killed on ``stop()``."""

    def __init__(self, *, host: str = "127.0.0.1", log_path: Path | None = None, start_timeout_s: float = 30.0) -> None:
        self.host = host
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.endpoint = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_fd: int | None = None

    @property
    def port(self) -> int:
        return int(urlsplit(self.endpoint).port or 0)

    def start(self) -> MotoProcess:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        else:
            fd = os.open(tempfile.gettempdir(), os.O_RDWR | os.O_TMPFILE, 0o600)
        self._log_fd = fd
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", "0"],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
        try:
            self.endpoint = self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> str:
        assert self.proc is not None and self._log_fd is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            text = os.pread(self._log_fd, 1 << 16, 0).decode(errors="replace")
            endpoint = parse_moto_endpoint(text, self.host)
            if endpoint:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{endpoint}/moto-api/", timeout=1.0, trust_env=False).status_code < 500:
                        return endpoint
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited ({self.proc.returncode}): {text[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"moto server not ready within {self.start_timeout_s}s")

    def create_bucket(self, name: str | None = None) -> str:
        """An empty bucket (moto accepts an unsigned ``PUT /<bucket>``)."""
        name = name or f"cryobox-fleet-{secrets.token_hex(4)}"
        response = httpx.put(f"{self.endpoint}/{quote(name)}", timeout=10.0, trust_env=False)
        if response.status_code != 200:
            raise RuntimeError(f"moto refused bucket {name}: {response.status_code} {response.text[:200]}")
        return name

    def store_url(self, bucket: str) -> str:
        return s3_store_url(bucket, self.endpoint)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None

    def __enter__(self) -> MotoProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- agent network namespaces ----------------------------------------------------------------------------------------


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
                index = pick_fleet_index(_ipv4_in_use())
                self.addresses = fleet_addresses(index)
                (STATE_DIR / f"{self.name}.pid").write_text(f"{os.getpid()}\n")
                _run(["ip", "netns", "add", self.name])
                _run(["ip", "link", "add", self.root_link, "type", "veth", "peer", "name", self.agent_link])
                _run(["ip", "addr", "add", f"{self.root_ip}/{self.addresses.prefixlen}", "dev", self.root_link])
            _run(["nft", "-f", "-"], stdin=guard_ruleset(self.table, self.root_link))
            _run(["ip", "link", "set", self.agent_link, "netns", self.name])
            _run(["ip", "link", "set", self.root_link, "up"])
            inside = ["ip", "-n", self.name]
            _run([*inside, "link", "set", "lo", "up"])
            _run([*inside, "addr", "add", f"{self.agent_ip}/{self.addresses.prefixlen}", "dev", self.agent_link])
            _run([*inside, "link", "set", self.agent_link, "up"])
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
                [sys.executable, "-m", "cryobox.bench.fleet_proc", "relay", str(self.path), *map(str, wanted)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                preexec_fn=_die_with_parent,
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
            _stop_popen(self._relay, signal.SIGKILL, 5.0)
            if self._relay.stdout is not None:
                self._relay.stdout.close()
        self._relay, self._relay_ports = None, ()

    def pids(self) -> list[int]:
        """Processes whose network namespace is this one (an agent, its memory server, QEMUs it left)."""
        if not self.path.exists():
            return []
        out = _run(["ip", "netns", "pids", self.name], check=False)
        return [int(p) for p in out.split() if p.isdigit()]

    def close(self) -> None:
        self._stop_relay()
        for pid in self.pids():
            _kill_pid(pid)
        _run(["nft", "delete", "table", "inet", self.table], check=False)
        _run(["ip", "link", "del", self.root_link], check=False)  # takes the peer with it
        if self.path.exists():
            _run(["ip", "netns", "del", self.name], check=False)
        (STATE_DIR / f"{self.name}.pid").unlink(missing_ok=True)

    # -- checks --------------------------------------------------------------------------------------------------

    def routes_inside(self) -> list[str]:
        return [line.strip() for line in _run(["ip", "-n", self.name, "-4", "route", "show"]).splitlines() if line]

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
        if owner and _pid_alive(owner):
            continue
        name = marker.name.removesuffix(".pid")
        parsed = parse_netns_name(name)
        if parsed is None:
            marker.unlink(missing_ok=True)
            continue
        AgentNetns(parsed[0], hex_id=parsed[1]).close()
        removed.append(name)
    return removed


# -- the relay (runs as its own process) -----------------------------------------------------------------------------


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _relay_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    finally:
        for w in (writer, up_writer):
            w.close()
            with contextlib.suppress(ConnectionError, OSError):
                await w.wait_closed()


async def _serve_relays(listeners: list[tuple[socket.socket, int]]) -> None:
    servers = []
    for sock, port in listeners:

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter, port: int = port) -> None:
            await _relay_connection(r, w, port)

        servers.append(await asyncio.start_server(handle, sock=sock, limit=1 << 20))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.gather(*(s.serve_forever() for s in servers))


def relay_main(netns_path: str, ports: list[int]) -> None:
    """Listen on 127.0.0.1:<port> inside ``netns_path`` for each port; forward to 127.0.0.1:<port> here."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    listeners = []
    for port in ports:
        sock = socket_in_netns(Path(netns_path))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(256)
        sock.setblocking(False)
        listeners.append((sock, port))
    asyncio.run(_serve_relays(listeners))


# -- control plane and agents ----------------------------------------------------------------------------------------


def _release_host_state(data_dir: Path, cache_dir: Path | None) -> None:
    """What :meth:`ServeProcess.cleanup` does, plus the stragglers a SIGKILLed agent leaves: its QEMUs (their
    ``-pidfile`` lies in our run dir), its memory server (by pid file), its per-sandbox namespaces (by tag)."""
    paths = Paths(data_dir, cache_dir or DEFAULT_CACHE_DIR)
    for pid in find_own_qemus(paths.run_dir):
        _kill_pid(pid)
    pidfile = paths.memserver_dir / "memserver.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text())
        if b"cryobox.agent.store.memserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
            _kill_pid(pid)
    unmount(paths.memserver_dir / "mnt")  # a memory server killed with its agent leaves its mount disconnected
    release_volume(data_dir)
    shutil.rmtree(paths.hot_dir, ignore_errors=True)
    if data_dir.exists():
        from ..agent.net.netlink import reclaim

        _in_thread(lambda: reclaim(tag_for(data_dir)))  # netlink calls must not run on an event loop thread


class _Process:
    """Common lifecycle: spawn, readiness poll, stop by PID (``sig`` then SIGKILL), restart on the same port."""

    what = "process"

    def __init__(self, data_dir: Path, log_name: str, extra_env: Mapping[str, str] | None) -> None:
        self.data_dir = data_dir
        self.log_path = data_dir / log_name
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def launch(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log, env=self.env(), stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.what} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if self.ready():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.what} did not come up within {timeout_s}s; see {self.log_path}")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        return _stop_popen(self.proc, sig, timeout_s)

    def kill(self) -> int | None:
        return self.stop(signal.SIGKILL)


class ControlProcess(_Process):
    """``cryobox control`` on ``listen_host:<free port>`` (chosen once: :meth:`restart` keeps it)."""

    what = "cryobox control"

    def __init__(
        self,
        data_dir: Path,
        *,
        database_url: str,
        node_token: str,
        api_key: str,
        store_url: str | None = None,
        cache_dir: Path | None = None,
        agent_deadline_s: float = 10.0,
        reap_interval_s: float | None = None,
        extra_env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        listen_host: str = "127.0.0.1",
    ) -> None:
        super().__init__(data_dir, "control.log", extra_env)
        self.database_url = database_url
        self.node_token = node_token
        self.api_key = api_key
        self.store_url = store_url
        self.cache_dir = cache_dir
        self.agent_deadline_s = agent_deadline_s
        self.reap_interval_s = reap_interval_s
        self.extra_args = list(extra_args)
        self.listen_host = listen_host
        self.port = free_port()
        self.url = f"http://{'127.0.0.1' if listen_host in ('0.0.0.0', '') else listen_host}:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "cryobox.cli.main", "control", "--listen", f"{self.listen_host}:{self.port}"]
        argv += ["--data-dir", str(self.data_dir), "--agent-deadline", str(self.agent_deadline_s)]
        if self.cache_dir is not None:
            argv += ["--cache-dir", str(self.cache_dir)]
        if self.store_url:
            argv += ["--store", self.store_url]
        if self.reap_interval_s is not None:
            argv += ["--reap-interval", str(self.reap_interval_s)]
        return argv + self.extra_args

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CRYOBOX_DATABASE_URL": self.database_url,
            "CRYOBOX_NODE_TOKEN": self.node_token,
            "CRYOBOX_API_KEY": self.api_key,
            **S3_CREDENTIALS,
            **self.extra_env,
        }

    def ready(self) -> bool:
        return httpx.get(f"{self.url}/healthz", timeout=1.0, trust_env=False).status_code == 200

    def start(self, timeout_s: float = 300.0) -> ControlProcess:
        self.launch()
        self.wait_ready(timeout_s)
        return self

    def restart(self, sig: int = signal.SIGTERM, timeout_s: float = 300.0) -> ControlProcess:
        self.stop(sig)
        return self.start(timeout_s)

    def agents(self, timeout_s: float = 5.0) -> dict[str, dict[str, Any]]:
        """``GET /v1/agents`` by agent name."""
        response = httpx.get(
            f"{self.url}/v1/agents",
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=timeout_s,
            trust_env=False,
        )
        response.raise_for_status()
        return agents_by_name(response.json())

    def cleanup(self) -> None:
        _release_host_state(self.data_dir, self.cache_dir)

    def __enter__(self) -> ControlProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self.cleanup()


class AgentProcess(_Process):
    """``cryobox agent`` in ``netns`` (``nsenter --net``; listening on the namespace's address) or, with
    ``netns=None``, on ``127.0.0.1:<free port>``. Ready when its healthz answers and, given ``api_key``, the control
    plane lists it ``up``. ``cleanup()`` releases what a dead agent may have left (see :func:`_release_host_state`)."""

    what = "cryobox agent"

    def __init__(
        self,
        name: str,
        data_dir: Path,
        *,
        control_url: str,
        node_token: str,
        store_url: str | None = None,
        cache_dir: Path | None = None,
        net_cidr: str | None = None,
        template_source: Literal["build", "store"] = "build",
        templates: Sequence[str] = ("base",),
        prespawn: int = 0,
        net_pool: int = 2,
        memory_mib: int | None = None,
        max_sandboxes: int | None = None,
        memory: Literal["hot", "lazy"] | None = None,
        heartbeat_interval_s: float | None = None,
        netns: AgentNetns | None = None,
        api_key: str | None = None,
        extra_env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(data_dir, "agent.log", extra_env)
        self.name = check_name(name)
        self.control_url = control_url
        self.node_token = node_token
        self.store_url = store_url
        self.cache_dir = cache_dir
        self.net_cidr = net_cidr
        self.template_source = template_source
        self.templates = tuple(templates)
        self.prespawn = prespawn
        self.net_pool = net_pool
        self.memory_mib = memory_mib
        self.max_sandboxes = max_sandboxes
        self.memory = memory
        self.heartbeat_interval_s = heartbeat_interval_s
        self.netns = netns
        self.api_key = api_key
        self.extra_args = list(extra_args)
        if netns is not None:
            self.listen_host, self.port = netns.agent_ip, AGENT_PORT
        else:
            self.listen_host, self.port = "127.0.0.1", free_port()
        self.url = f"http://{self.listen_host}:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "cryobox.cli.main", "agent", "--listen", f"{self.listen_host}:{self.port}"]
        argv += ["--control", self.control_url, "--data-dir", str(self.data_dir), "--name", self.name]
        argv += ["--advertise", self.url, "--template-source", self.template_source]
        argv += ["--templates", ",".join(self.templates), "--prespawn", str(self.prespawn)]
        argv += ["--net-pool", str(self.net_pool)]
        if self.cache_dir is not None:
            argv += ["--cache-dir", str(self.cache_dir)]
        if self.store_url:
            argv += ["--store", self.store_url]
        if self.memory_mib is not None:
            argv += ["--memory-mib", str(self.memory_mib)]
        if self.max_sandboxes is not None:
            argv += ["--max-sandboxes", str(self.max_sandboxes)]
        if self.memory is not None:
            argv += ["--memory", self.memory]
        if self.heartbeat_interval_s is not None:
            argv += ["--heartbeat-interval", str(self.heartbeat_interval_s)]
        argv += self.extra_args
        return self.netns.wrap(argv) if self.netns is not None else argv

    def env(self) -> dict[str, str]:
        env = {**os.environ, "CRYOBOX_NODE_TOKEN": self.node_token, **S3_CREDENTIALS}
        if self.net_cidr:
            env[CIDR_ENV] = self.net_cidr
        return {**env, **self.extra_env}

    def launch(self) -> None:
        if self.netns is not None:
            self.netns.log_dir = self.data_dir
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.netns.forward_loopback(loopback_ports([self.control_url, self.store_url or ""]))
        super().launch()

    def healthy(self) -> bool:
        headers = {"Authorization": f"Bearer {self.node_token}"}
        url = f"{self.url}/agent/v1/healthz"
        return httpx.get(url, headers=headers, timeout=1.0, trust_env=False).status_code == 200

    def status(self) -> str | None:
        """This agent's status in the control plane (``None`` when not listed, or without ``api_key``)."""
        if self.api_key is None:
            return None
        response = httpx.get(
            f"{self.control_url}/v1/agents",
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=2.0,
            trust_env=False,
        )
        response.raise_for_status()
        agent = agents_by_name(response.json()).get(self.name)
        return None if agent is None else str(agent.get("status"))

    def ready(self) -> bool:
        return self.healthy() and (self.api_key is None or self.status() == "up")

    def start(self, timeout_s: float = 1800.0) -> AgentProcess:
        self.launch()
        self.wait_ready(timeout_s)
        return self

    def restart(self, sig: int = signal.SIGTERM, timeout_s: float = 1800.0) -> AgentProcess:
        self.stop(sig)
        return self.start(timeout_s)

    @property
    def paths(self) -> Paths:
        return Paths(self.data_dir, self.cache_dir or DEFAULT_CACHE_DIR)

    @property
    def memserver_socket(self) -> Path:
        return self.paths.memserver_dir / "control.sock"

    def memserver_stats(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The memory server's ``GET /stats`` (control socket: a unix socket, reachable from any namespace)."""
        transport = httpx.HTTPTransport(uds=str(self.memserver_socket))
        with httpx.Client(transport=transport, base_url="http://memserver", timeout=timeout_s) as client:
            response = client.get("/stats")
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result

    def metrics_text(self, timeout_s: float = 10.0) -> str:
        headers = {"Authorization": f"Bearer {self.node_token}"}
        response = httpx.get(f"{self.url}/agent/v1/metrics", headers=headers, timeout=timeout_s, trust_env=False)
        response.raise_for_status()
        return response.text

    def cleanup(self) -> None:
        _release_host_state(self.data_dir, self.cache_dir)
        if self.netns is None and self.data_dir.exists():  # in its own namespace the table went with it
            from ..agent.net.firewall import Firewall
            from ..agent.net.slots import SlotPlan

            with contextlib.suppress(Exception):
                Firewall(SlotPlan(tag=tag_for(self.data_dir), cidr=self.net_cidr or "10.200.0.0/16")).remove()

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        self.cleanup()


# -- the fleet -------------------------------------------------------------------------------------------------------


class Fleet:
    """PostgreSQL + moto + ``cryobox control`` + ``agents`` agents (``a0``, ``a1``, ...), torn down whatever happens.

    With ``template_source="store"`` the bucket starts empty, so a preparatory ``cryobox serve --template-source
    build`` on the same store first publishes ``templates`` (it bakes them from the shared cache dir, once).
    """

    def __init__(
        self,
        root: Path,
        *,
        agents: int | Sequence[str] = 3,
        cache_dir: Path | None = None,
        isolation: Literal["netns", "loopback"] = "netns",
        template_source: Literal["build", "store"] = "store",
        memory: Literal["hot", "lazy"] | None = "lazy",
        templates: Sequence[str] = ("base",),
        prespawn: int = 0,
        net_pool: int = 2,
        memory_mib: int | None = None,
        max_sandboxes: int | None = None,
        heartbeat_interval_s: float | None = 1.0,
        agent_deadline_s: float = 10.0,
        publish: bool | None = None,
        agent_env: Mapping[str, str] | None = None,
        agent_args: Sequence[str] = (),
        control_env: Mapping[str, str] | None = None,
        control_args: Sequence[str] = (),
        start_timeout_s: float = 1800.0,
    ) -> None:
        self.root = root
        self.names = [f"a{i}" for i in range(agents)] if isinstance(agents, int) else [check_name(a) for a in agents]
        self.cache_dir = cache_dir
        self.isolation = isolation
        self.template_source = template_source
        self.memory = memory
        self.templates = tuple(templates)
        self.prespawn = prespawn
        self.net_pool = net_pool
        self.memory_mib = memory_mib
        self.max_sandboxes = max_sandboxes
        self.heartbeat_interval_s = heartbeat_interval_s
        self.agent_deadline_s = agent_deadline_s
        self.publish = template_source == "store" if publish is None else publish
        self.agent_env = dict(agent_env or {})
        self.agent_args = list(agent_args)
        self.control_env = dict(control_env or {})
        self.control_args = list(control_args)
        self.start_timeout_s = start_timeout_s
        self.api_key = "cbx_fleet_" + secrets.token_hex(8)
        self.node_token = "node_" + secrets.token_hex(16)
        self.postgres: PostgresProcess | None = None
        self.moto: MotoProcess | None = None
        self.bucket = ""
        self.store_url = ""
        self.control: ControlProcess | None = None
        self.agents: dict[str, AgentProcess] = {}
        self.namespaces: dict[str, AgentNetns] = {}

    @property
    def url(self) -> str:
        if self.control is None:
            raise RuntimeError("fleet not started")
        return self.control.url

    def env(self) -> dict[str, str]:
        return {"CRYOBOX_API_URL": self.url, "CRYOBOX_API_KEY": self.api_key}

    def agent(self, name: str) -> AgentProcess:
        return self.agents[name]

    def start(self) -> Fleet:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        reap_stale_netns()
        self.postgres = PostgresProcess().start()
        self.moto = MotoProcess(log_path=self.root / "moto.log").start()
        self.bucket = self.moto.create_bucket()
        self.store_url = self.moto.store_url(self.bucket)
        if self.publish:
            self._publish_templates()
        self.control = ControlProcess(
            self.root / "control",
            database_url=self.postgres.url,
            node_token=self.node_token,
            api_key=self.api_key,
            store_url=self.store_url,
            cache_dir=self.cache_dir,
            agent_deadline_s=self.agent_deadline_s,
            extra_env=self.control_env,
            extra_args=self.control_args,
        ).start()
        taken = _ipv4_in_use() if self.isolation == "loopback" else []
        cidrs = slot_cidrs(len(self.names), taken)
        for name, cidr in zip(self.names, cidrs, strict=True):
            netns = None
            if self.isolation == "netns":
                netns = self.namespaces[name] = AgentNetns(name).create()
            agent = self.agents[name] = AgentProcess(
                name,
                self.root / name,
                control_url=self.control.url,
                node_token=self.node_token,
                store_url=self.store_url,
                cache_dir=self.cache_dir,
                net_cidr=cidr,
                template_source=self.template_source,
                templates=self.templates,
                prespawn=self.prespawn,
                net_pool=self.net_pool,
                memory_mib=self.memory_mib,
                max_sandboxes=self.max_sandboxes,
                memory=self.memory,
                heartbeat_interval_s=self.heartbeat_interval_s,
                netns=netns,
                api_key=self.api_key,
                extra_env=self.agent_env,
                extra_args=self.agent_args,
            )
            agent.launch()
        for agent in self.agents.values():  # launched together, so they come up in parallel
            agent.wait_ready(self.start_timeout_s)

    def _publish_templates(self) -> None:
        args = ["--store", self.store_url, "--template-source", "build", "--templates", ",".join(self.templates)]
        args += ["--memory", "lazy", "--net-pool", "1"]
        serve = ServeProcess(
            self.root / "publish", cache_dir=self.cache_dir, prespawn=0, extra_env=S3_CREDENTIALS, extra_args=args
        )
        try:
            serve.start(self.start_timeout_s)  # publishing happens while it starts up
        finally:
            serve.stop()
            serve.cleanup()

    def agents_view(self) -> dict[str, dict[str, Any]]:
        if self.control is None:
            raise RuntimeError("fleet not started")
        return self.control.agents()

    def wait_agent_status(self, name: str, status: str | Collection[str], timeout_s: float = 60.0) -> str:
        """Poll ``GET /v1/agents`` until ``name``'s status is ``status`` (or one of them); returns it."""
        wanted = {status} if isinstance(status, str) else set(status)
        return self._wait_status(name, lambda s: s in wanted, f"in {sorted(wanted)}", timeout_s)

    def wait_agent_not_up(self, name: str, timeout_s: float = 60.0) -> str:
        """Poll until the control plane no longer lists ``name`` as ``up`` (``"missing"`` when it is not listed)."""
        return self._wait_status(name, lambda s: s != "up", "not up", timeout_s)

    def _wait_status(self, name: str, accept: Callable[[str], bool], what: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        seen = "?"
        while True:
            try:
                agent = self.agents_view().get(name)
                seen = "missing" if agent is None else str(agent.get("status"))
                if accept(seen):
                    return seen
            except httpx.HTTPError as err:
                seen = f"error: {err}"
            if time.monotonic() >= deadline:
                raise TimeoutError(f"agent {name} not {what} within {timeout_s}s (last seen: {seen})")
            time.sleep(0.25)

    def kill_agent(self, name: str) -> int | None:
        return self.agents[name].kill()

    def close(self) -> None:
        """Stop and release everything, in reverse order; every step runs even when an earlier one failed."""
        steps: list[Callable[[], object]] = []
        for agent in self.agents.values():
            steps += [agent.stop, agent.cleanup]
        steps += [ns.close for ns in self.namespaces.values()]
        if self.control is not None:
            steps += [self.control.stop, self.control.cleanup]
        if self.moto is not None:
            steps.append(self.moto.stop)
        if self.postgres is not None:
            steps.append(self.postgres.stop)
        errors = []
        for step in steps:
            try:
                step()
            except Exception as err:
                errors.append(err)
        if errors:
            print(f"fleet teardown: {len(errors)} step(s) failed; first: {errors[0]!r}", file=sys.stderr)

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def main(argv: Sequence[str]) -> None:
    if len(argv) >= 2 and argv[0] == "relay":
        relay_main(argv[1], [int(p) for p in argv[2:]])
        return
    raise SystemExit("usage: python -m cryobox.bench.fleet_proc relay NETNS_PATH PORT...")


if __name__ == "__main__":
    main(sys.argv[1:])
