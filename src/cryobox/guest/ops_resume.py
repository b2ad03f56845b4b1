"""The ``resume`` op: make a restored guest right about the world again, then run the user's resume hooks.

The host calls it on every restore, fork-tree child, resume and wake, before it reports the sandbox ready.
Args::

    {"epoch_ns": int,            # host CLOCK_REALTIME to step to (required, >= 0)
     "entropy": "<base64>",      # 32..4096 fresh random bytes from the host (required)
     "instance_id": "sbx-123",   # [A-Za-z0-9-]{1,64} (required)
     "run_hooks": true,          # false when the host pre-warms a pooled VM (no user code runs)
     "rejoined": false,          # true: this VM already rejoined as instance_id (a warm pool VM, at warm-up)
     "volumes": [...]}           # optional: volumes to mount right after the clock step (.ops_volumes)

Steps, strictly in this order (each one's agent work, then that order's hooks):

1. ``clock``: step CLOCK_REALTIME to ``epoch_ns`` (the agent's clock setter; the op fails with
   ``permission_denied`` if that is refused, before anything else happens). Then the hook files of
   ``/etc/cryobox/resume.d`` are loaded (timed as ``load_hooks``) and the ``clock`` hooks run. With
   ``volumes``, they are mounted between the clock step and the hooks (timed as ``volumes``), so every hook
   sees them.
2. ``names``: flush the neighbour table (rtnetlink, :mod:`.netlink`) and any resolver cache
   (``nscd -i hosts``, ``resolvectl flush-caches``); ``names`` hooks.
3. ``identity``: reseed the kernel RNG with the host's entropy (``RNDADDENTROPY`` + ``RNDRESEEDCRNG`` on
   /dev/random, plus a write to /dev/urandom) and atomically write ``/run/cryobox/instance-id``;
   ``identity`` hooks.
4. ``connections`` hooks, 5. ``readiness`` hooks.

With ``rejoined``, steps 2 and 3 keep what an earlier ``resume`` of this same VM did — the host sends it for a warm
pool VM, which ran the whole sequence while it warmed, in the network slot it is handed out in, as the instance it
becomes, and was paused since: its neighbours and caches were flushed there, its RNG was reseeded after it was
cloned (no other VM shares its state), its instance id is written. Only if ``/run/cryobox/instance-id`` holds
``instance_id`` already; otherwise the full sequence runs. Their hooks run either way. Skipping them took ~6 ms of
a create's ~10 ms rejoin under TCG.

Reply::

    {"before_ns", "after_ns", "step_ns",     # wall clock just before/after the step; step = epoch_ns - before_ns
     "neighbours_flushed": int, "resolver": "none" | "nscd" | "resolvectl" | "nscd+resolvectl",
     "reseeded": bool, "instance_id": str, "rejoined": bool,   # rejoined: steps 2 and 3 kept (see above)
     "steps_ms": {"clock", "load_hooks", "names", "identity", "connections", "readiness", "total"},
     "hooks": [{"name", "order", "ok", "error", "ms"}, ...],   # run order; a file that failed to load is
                                                               # reported with order "load"
     "volumes": [{"path", "serial", "device", "ok", "error", "ms"}, ...],   # only when asked to mount any
     "errors": {"neighbours" | "resolver" | "reseed" | "instance_id": "message"}}  # empty when all went well

Failures after the clock step do not stop later steps: the agent's own ones go to ``errors`` (and show as
``reseeded: false`` etc.), failed hooks have ``ok: false``. The host decides what is fatal.

The op is answered on the agent's reader thread (see ``agent.INLINE_OPS``) so that the clock step lands as
soon as the request is read. The price: the reader reads no other request until resume returns, i.e. until
every hook finished or timed out (at most one timeout per hook file and per hook). Requests the host sends
after ``resume`` are therefore only started once the guest is fully resumed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import hooks, netlink
from .ops_files import OpError, decode_b64, invalid, optional_bool
from .ops_volumes import VolumeMount, VolumeSystem, mount_volumes, parse_mounts

INSTANCE_ID_PATH = "/run/cryobox/instance-id"
INSTANCE_ID_RE = re.compile(r"[A-Za-z0-9-]{1,64}")
MIN_ENTROPY = 32
MAX_ENTROPY = 4096
NSCD_PATH = "/usr/sbin/nscd"
RESOLVER_TIMEOUT = 5.0


def _ioc(direction: int, kind: str, number: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (ord(kind) << 8) | number


RNDADDENTROPY = _ioc(1, "R", 0x03, 8)  # _IOW('R', 0x03, int[2]) == 0x40085203
RNDRESEEDCRNG = _ioc(0, "R", 0x07, 0)  # _IO('R', 0x07) == 0x5207
RAND_POOL_INFO = struct.Struct("=ii")  # struct rand_pool_info {int entropy_count; int buf_size; __u32 buf[];}

Emit = Callable[[str, bytes], None]
ClockSetter = Callable[[int], None]
Ioctl = Callable[[int, int, Any], object]


def pack_rand_pool_info(entropy: bytes) -> bytes:
    """``struct rand_pool_info`` crediting every byte of ``entropy`` as 8 bits."""
    return RAND_POOL_INFO.pack(len(entropy) * 8, len(entropy)) + entropy


def _real_ioctl(fd: int, request: int, arg: Any) -> object:
    return fcntl.ioctl(fd, request, arg)


@dataclass(frozen=True)
class KernelRng:
    """Feeds host entropy into the kernel RNG. Paths and ``ioctl`` are injectable for tests."""

    random_path: str = "/dev/random"
    urandom_path: str = "/dev/urandom"
    ioctl: Ioctl = _real_ioctl

    def reseed(self, entropy: bytes) -> None:
        """Add ``entropy`` with full credit, mix it in via /dev/urandom too, then force a CRNG reseed.
        Every part is attempted; the first failure is raised at the end (the ioctls need CAP_SYS_ADMIN)."""
        failures: list[OSError] = []
        fd = os.open(self.random_path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            try:
                self.ioctl(fd, RNDADDENTROPY, bytearray(pack_rand_pool_info(entropy)))
            except OSError as err:
                failures.append(err)
            try:
                with open(self.urandom_path, "wb", buffering=0) as urandom:
                    urandom.write(entropy)
            except OSError as err:
                failures.append(err)
            try:
                self.ioctl(fd, RNDRESEEDCRNG, 0)
            except OSError as err:
                failures.append(err)
        finally:
            os.close(fd)
        if failures:
            raise failures[0]


def flush_resolver_caches(nscd_path: str = NSCD_PATH, resolvectl: str | None = "resolvectl") -> tuple[str, str | None]:
    """Flush the caches of whichever resolver daemons are installed.

    Returns (what ran: ``"none"``, ``"nscd"``, ``"resolvectl"`` or ``"nscd+resolvectl"``; an error message or
    None). ``resolvectl`` is looked up on PATH; pass None to skip it.
    """
    commands: list[tuple[str, list[str]]] = []
    if os.path.exists(nscd_path):
        commands.append(("nscd", [nscd_path, "-i", "hosts"]))
    resolvectl_path = shutil.which(resolvectl) if resolvectl else None
    if resolvectl_path:
        commands.append(("resolvectl", [resolvectl_path, "flush-caches"]))
    errors = []
    for label, argv in commands:
        try:
            proc = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=RESOLVER_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            errors.append(f"{label}: {err}")
            continue
        if proc.returncode != 0:
            detail = proc.stderr.decode(errors="replace").strip() or f"exit status {proc.returncode}"
            errors.append(f"{label}: {detail}")
    ran = "+".join(label for label, _ in commands) or "none"
    return ran, "; ".join(errors) or None


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class ResumeSystem:
    """Everything ``resume`` touches outside the agent process besides the clock (the agent's setter).
    The defaults act on the machine the agent runs on; tests must replace every field."""

    flush_neighbours: Callable[[], int] = netlink.flush_neighbours
    flush_resolvers: Callable[[], tuple[str, str | None]] = flush_resolver_caches
    reseed: Callable[[bytes], None] = KernelRng().reseed
    instance_id_path: str = INSTANCE_ID_PATH
    hooks_dir: str = hooks.HOOKS_DIR
    hook_timeout: float = hooks.DEFAULT_TIMEOUT
    volumes: VolumeSystem = VolumeSystem()


@dataclass(frozen=True)
class ResumeRequest:
    epoch_ns: int
    entropy: bytes
    instance_id: str
    run_hooks: bool
    volumes: tuple[VolumeMount, ...] = ()
    rejoined: bool = False


def parse_resume_args(args: dict[str, Any]) -> ResumeRequest:
    epoch_ns = args.get("epoch_ns")
    if isinstance(epoch_ns, bool) or not isinstance(epoch_ns, int) or epoch_ns < 0:
        raise invalid("'epoch_ns' must be a non-negative integer")
    if "entropy" not in args:
        raise invalid("'entropy' is required")
    entropy = decode_b64(args.get("entropy"), "entropy")
    if not MIN_ENTROPY <= len(entropy) <= MAX_ENTROPY:
        raise invalid(f"'entropy' must hold {MIN_ENTROPY} to {MAX_ENTROPY} bytes, got {len(entropy)}")
    instance_id = args.get("instance_id")
    if not isinstance(instance_id, str) or not INSTANCE_ID_RE.fullmatch(instance_id):
        raise invalid("'instance_id' must be 1 to 64 characters of [A-Za-z0-9-]")
    return ResumeRequest(
        epoch_ns,
        entropy,
        instance_id,
        optional_bool(args, "run_hooks", True),
        parse_mounts(args.get("volumes")),
        optional_bool(args, "rejoined", False),
    )


def _holds(path: str, instance_id: str) -> bool:
    """Whether the instance id file says ``instance_id`` (as :func:`write_atomic` wrote it). Read as bytes: a text
    read's first use imports a codec, ~17 ms of a hand-out under TCG."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.read(fd, 128) == instance_id.encode() + b"\n"
    except OSError:
        return False
    finally:
        os.close(fd)


def _describe(err: BaseException) -> str:
    if isinstance(err, OSError) and err.errno is not None and err.strerror:
        name = errno.errorcode.get(err.errno, str(err.errno))
        return f"{name}: {err.strerror}" + (f" ({err.filename})" if err.filename else "")
    return f"{type(err).__name__}: {err}"


class Resumer:
    """The ``resume`` op handler. One resume at a time (a second caller waits for the first)."""

    def __init__(self, clock_setter: ClockSetter, system: ResumeSystem | None = None) -> None:
        self._clock_setter = clock_setter
        self.system = system or ResumeSystem()
        self._lock = threading.Lock()

    def __call__(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        request = parse_resume_args(args)
        with self._lock:
            return self.resume(request)

    def resume(self, req: ResumeRequest) -> dict[str, Any]:
        system = self.system
        steps: dict[str, float] = {}
        errors: dict[str, str] = {}
        results: list[hooks.HookResult] = []
        total_start = mark = time.perf_counter()

        def lap(step: str) -> None:
            nonlocal mark
            now = time.perf_counter()
            steps[step] = round(steps.get(step, 0.0) + (now - mark) * 1000, 3)
            mark = now

        # 1. clock: first, so it lands as close to the host's stamp as possible
        before_ns = time.time_ns()
        try:
            self._clock_setter(req.epoch_ns)
        except PermissionError as err:
            raise OpError("permission_denied", f"cannot set the clock: {err}") from err
        after_ns = time.time_ns()
        step_ns = req.epoch_ns - before_ns
        lap("clock")

        mounted = mount_volumes(req.volumes, system.volumes) if req.volumes else None
        if mounted is not None:
            lap("volumes")

        registry = hooks.HookRegistry()
        if req.run_hooks:
            registry, load_failures = hooks.load_hooks(system.hooks_dir, system.hook_timeout)
            results.extend(load_failures)
        lap("load_hooks")
        context: dict[str, Any] = {"instance_id": req.instance_id, "clock_step_ns": step_ns}

        def run(order: str) -> None:
            results.extend(hooks.run_hooks(registry, order, context, system.hook_timeout))
            lap(order)

        run("clock")

        rejoined = req.rejoined and _holds(system.instance_id_path, req.instance_id)

        # 2. names
        flushed = 0
        resolver = "none"
        if not rejoined:
            try:
                flushed = system.flush_neighbours()
            except Exception as err:
                errors["neighbours"] = _describe(err)
            try:
                resolver, resolver_error = system.flush_resolvers()
                if resolver_error:
                    errors["resolver"] = resolver_error
            except Exception as err:
                errors["resolver"] = _describe(err)
        run("names")

        # 3. identity
        reseeded = False
        if not rejoined:
            try:
                system.reseed(req.entropy)
                reseeded = True
            except Exception as err:
                errors["reseed"] = _describe(err)
            try:
                write_atomic(system.instance_id_path, req.instance_id + "\n")
            except Exception as err:
                errors["instance_id"] = _describe(err)
        run("identity")

        # 4., 5.
        run("connections")
        run("readiness")
        steps["total"] = round((time.perf_counter() - total_start) * 1000, 3)
        reply: dict[str, Any] = {
            "before_ns": before_ns,
            "after_ns": after_ns,
            "step_ns": step_ns,
            "neighbours_flushed": flushed,
            "resolver": resolver,
            "reseeded": reseeded,
            "rejoined": rejoined,
            "instance_id": req.instance_id,
            "steps_ms": steps,
            "hooks": [r.to_json() for r in results],
            "errors": errors,
        }
        if mounted is not None:
            reply["volumes"] = mounted
        return reply
