"""Who owns a data dir's host resources: an exclusive lock while an agent runs, and an owner record that outlives it.

- **Lock** (:class:`OwnerLock`): ``flock(LOCK_EX)`` on ``<data_dir>/agent.lock`` for the agent's lifetime; the
  kernel drops it when the process dies, however it dies. A second agent on the same data dir is refused with
  :class:`~cryobox.errors.StateError`. The file holds the holder's pid (for messages only).
- **Owner record** (:func:`write_owner`): ``/run/cryobox/owners/<tag>.json`` = ``{tag, data_dir, hot_dir, pid,
  started_at}``, written atomically at start and kept after a stop (``/run`` is cleared at boot, like everything it
  describes). It maps the names of a data dir's host-wide resources (netns ``cryobox-<tag>-*``, links
  ``cb<tag>h*``, the nft table ``inet cryobox_<tag>``, the hot dir) back to the data dir, so ``cryobox gc`` can
  reclaim them once that data dir is gone (:mod:`.gc`).
- **Slot network** (:meth:`Ownership.claim_slots`): the record also names the CIDR the agent's network slots use.
  Two agents starting at once on one host both read the routing table before either has built a slot; so the pick
  happens under a host-wide lock (``<owners dir>/slots.lock``) and counts the CIDRs of other running agents'
  records as taken, besides the routes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

from ...config import Paths
from ...errors import StateError
from ...util.files import write_json_atomic
from ..net.slots import tag_for

log = logging.getLogger(__name__)

LOCK_NAME = "agent.lock"
SLOTS_LOCK_NAME = "slots.lock"
OWNERS_DIR = Path("/run/cryobox/owners")
OWNERS_DIR_ENV = "CRYOBOX_OWNERS_DIR"
ACQUIRE_WAIT_S = 1.0
"""How long :meth:`OwnerLock.acquire` retries: a probe (:func:`held_by_other`) holds the lock for microseconds."""


def owners_dir_from_env(env: Mapping[str, str] | None = None) -> Path:
    """``CRYOBOX_OWNERS_DIR`` (tests point it at a temporary directory), else ``/run/cryobox/owners``."""
    value = (os.environ if env is None else env).get(OWNERS_DIR_ENV, "")
    return Path(value) if value else OWNERS_DIR


def lock_path(data_dir: Path) -> Path:
    return data_dir / LOCK_NAME


def _holder(path: Path) -> str:
    with contextlib.suppress(OSError, ValueError):
        return str(int(path.read_text().strip() or "x"))
    return "unknown"


class OwnerLock:
    """The exclusive lock on ``<data_dir>/agent.lock``; use :meth:`acquire` / :meth:`release` or ``with``."""

    def __init__(
        self,
        data_dir: Path,
        wait_s: float = ACQUIRE_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.data_dir = data_dir
        self.path = lock_path(data_dir)
        self._wait_s = wait_s
        self._clock = clock
        self._sleep = sleep
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> OwnerLock:
        """Take the lock (idempotent). :raises StateError: another live process holds it."""
        if self._fd is not None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = self._clock() + self._wait_s
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self._clock() >= deadline:
                        raise StateError(
                            f"data dir {self.data_dir} is in use by another cryobox agent (pid {_holder(self.path)}; "
                            f"lock {self.path}); stop it or use another --data-dir",
                            state="locked",
                            required="unlocked",
                            details={"data_dir": str(self.data_dir), "lock": str(self.path)},
                        ) from None
                    self._sleep(0.01)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (idempotent). The file stays: removing it would race a new holder."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> OwnerLock:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def held_by_other(data_dir: Path) -> bool:
    """Whether another process holds ``data_dir``'s lock, without taking it (a shared, non-blocking probe that
    is dropped at once). ``False`` when this process is the holder."""
    try:
        fd = os.open(lock_path(data_dir), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: nobody ever locked it (or the data dir is gone)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(lock_path(data_dir)) != str(os.getpid())
        return False
    finally:
        os.close(fd)  # drops the probe's shared lock


@dataclass(frozen=True)
class OwnerRecord:
    tag: str
    data_dir: str
    hot_dir: str
    pid: int
    started_at: float
    uid_base: int | None = None
    """The first uid of the data dir's jail range (``None``: not jailed)."""
    slot_cidr: str | None = None
    """The CIDR of the data dir's network slots (``None``: not chosen yet)."""

    @classmethod
    def for_paths(
        cls, paths: Paths, pid: int | None = None, started_at: float | None = None, uid_base: int | None = None
    ) -> OwnerRecord:
        return cls(
            tag=tag_for(paths.data_dir),
            data_dir=str(paths.data_dir.resolve()),
            hot_dir=str(paths.hot_dir),
            pid=os.getpid() if pid is None else pid,
            started_at=time.time() if started_at is None else started_at,
            uid_base=uid_base,
        )

    @classmethod
    def from_json(cls, value: object) -> OwnerRecord:
        if not isinstance(value, dict):
            raise ValueError(f"an owner record is an object, got {type(value).__name__}")
        return cls(
            tag=str(value["tag"]),
            data_dir=str(value["data_dir"]),
            hot_dir=str(value["hot_dir"]),
            pid=int(value["pid"]),
            started_at=float(value["started_at"]),
            uid_base=int(value["uid_base"]) if value.get("uid_base") is not None else None,
            slot_cidr=str(value["slot_cidr"]) if value.get("slot_cidr") else None,
        )


def record_path(tag: str, owners_dir: Path = OWNERS_DIR) -> Path:
    return owners_dir / f"{tag}.json"


def write_owner(record: OwnerRecord, owners_dir: Path = OWNERS_DIR) -> Path:
    """Write (atomically) the record of the data dir that owns ``record.tag``'s resources."""
    owners_dir.mkdir(parents=True, exist_ok=True)
    path = record_path(record.tag, owners_dir)
    write_json_atomic(path, asdict(record))
    return path


def read_owners(owners_dir: Path = OWNERS_DIR) -> list[OwnerRecord]:
    """Every readable owner record (a damaged one is logged and skipped)."""
    records = []
    for path in sorted(owners_dir.glob("*.json")) if owners_dir.is_dir() else []:
        try:
            records.append(OwnerRecord.from_json(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("ignoring unreadable owner record %s: %s", path, err)
    return records


def remove_owner(tag: str, owners_dir: Path = OWNERS_DIR) -> bool:
    try:
        record_path(tag, owners_dir).unlink()
    except FileNotFoundError:
        return False
    return True


def wait_unlocked(data_dir: Path, timeout_s: float = 120.0) -> None:
    """Wait until no process holds ``data_dir``'s agent lock (an upgrade's predecessor stopping), without taking it
    for longer than a moment. :raises StateError: still held after ``timeout_s``."""
    OwnerLock(data_dir, wait_s=timeout_s).acquire().release()


class Ownership:
    """What an agent holds for its lifetime: the data dir's lock and its owner record (``claim`` at start,
    ``release`` at stop; the record stays for ``cryobox gc``)."""

    def __init__(self, paths: Paths, owners_dir: Path | None = None) -> None:
        self.paths = paths
        self.owners_dir = owners_dir if owners_dir is not None else owners_dir_from_env()
        self.lock = OwnerLock(paths.data_dir)
        self.record: OwnerRecord | None = None

    def claim(self, uid_base: int | None = None) -> Ownership:
        """:raises StateError: another agent runs on this data dir, or a running agent of another data dir
        jails its VMs with the same uid range (nothing is written then)."""
        self.lock.acquire()
        try:
            mine = str(self.paths.data_dir.resolve())
            for other in read_owners(self.owners_dir) if uid_base is not None else []:
                if other.uid_base == uid_base and other.data_dir != mine and held_by_other(Path(other.data_dir)):
                    raise StateError(
                        f"jail uids from {uid_base} are in use by the agent of {other.data_dir}; "
                        "set CRYOBOX_JAIL_UID_BASE to a free range",
                        state="uids_in_use",
                        required="free_uid_range",
                    )
            self.record = OwnerRecord.for_paths(self.paths, uid_base=uid_base)
            write_owner(self.record, self.owners_dir)
        except BaseException:
            self.lock.release()
            raise
        return self

    def claim_slots(
        self,
        pick: Callable[[list[ipaddress.IPv4Network]], str],
        routes: Callable[[], list[ipaddress.IPv4Network]],
    ) -> str:
        """Choose this agent's slot CIDR with ``pick(taken)`` and record it, atomically with respect to other agents
        on this host: ``taken`` is ``routes()`` (read under the lock) plus the slot CIDRs recorded by every other
        agent that runs now. Call after :meth:`claim`. Returns the CIDR picked."""
        if self.record is None:
            raise StateError("claim the data dir before its slot network", state="unclaimed", required="claimed")
        self.owners_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.owners_dir / SLOTS_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for a netlink dump and two small files: milliseconds
            taken = routes() + running_slot_networks(self.owners_dir, exclude=self.record.data_dir)
            cidr = pick(taken)
            self.record = dataclasses.replace(self.record, slot_cidr=cidr)
            write_owner(self.record, self.owners_dir)
            return cidr
        finally:
            os.close(fd)

    def release(self) -> None:
        self.lock.release()


def running_slot_networks(owners_dir: Path, exclude: str = "") -> list[ipaddress.IPv4Network]:
    """The slot CIDRs recorded by agents that run now (their data dir's lock is held), except ``exclude``'s."""
    found = []
    for other in read_owners(owners_dir):
        if other.slot_cidr and other.data_dir != exclude and held_by_other(Path(other.data_dir)):
            with contextlib.suppress(ValueError):
                net = ipaddress.ip_network(other.slot_cidr)
                if isinstance(net, ipaddress.IPv4Network):
                    found.append(net)
    return found
