"""The guest agent: reads request frames from one connection and answers each in its own thread.

A connection is a file descriptor (the virtio-serial port, a unix socket, a socketpair end). It is switched
to non-blocking mode while served so that a reply written after the host went away is dropped instead of
blocking forever; every frame is written whole under one lock, so frames from different requests never mix.

Every request gets a :class:`StreamEmit`: callable as ``emit(event, data)`` and carrying ``cancelled`` (a
``threading.Event``). The inline op ``cancel`` (``{"request": id}``) sets it for the running request with that
id on the same connection; when the connection ends, every request still running on it is cancelled too (no
one is left to read its events). Ops that stream forever (``watch_dir``) or may detach (``proc_start`` with
``attach``, ``proc_connect``) watch the flag; other ops ignore it.
"""

from __future__ import annotations

import base64
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import ops_exec
from .ops_files import FILE_OPS, FileOp, OpError, error_from_oserror, invalid
from .ops_inspect import InspectSources, NetInspector
from .ops_procs import ProcTable
from .ops_pty import PtySessions
from .ops_resume import Resumer, ResumeSystem
from .ops_volume_release import VolumeHolds
from .ops_volumes import VolumeSettler
from .ops_watch import WatcherTable, op_watch_dir
from .protocol import HEADER, FrameError, decode_body, decode_length, encode

AGENT_VERSION = 1
READ_SIZE = 1024 * 1024
WRITE_POLL_MS = 100  # how often a writer blocked by a full connection re-checks whether it was closed
# Ops answered on the reader thread itself. Starting a thread costs milliseconds under TCG, and set_clock's
# precision is the time between the host stamping the request and the guest applying it. ``resume`` steps the
# clock first for the same reason; the trade-off is that its hooks (each in its own thread, with a timeout)
# keep the reader busy until the last one finished or timed out, so requests sent after a resume start only
# once the guest is fully resumed (which is also the order the host wants).
# ``cancel`` must act while the request it names runs, so it never queues behind a thread start either.
INLINE_OPS = frozenset({"ping", "set_clock", "resume", "cancel"})

Emit = Callable[[str, bytes], None]  # a StreamEmit is one; ops that need the cancel flag read ``emit.cancelled``
Handler = Callable[[dict[str, Any], Emit], dict[str, Any]]
ClockSetter = Callable[[int], None]


def log(message: str) -> None:
    print(f"cryobox-guest[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def set_realtime_clock(epoch_ns: int) -> None:
    time.clock_settime_ns(time.CLOCK_REALTIME, epoch_ns)


class Connection:
    """Write side of a served fd. Thread-safe; writes after :meth:`close` or a write error are dropped."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, message: dict[str, Any]) -> None:
        self.send_frame(encode(message))

    def send_frame(self, frame: bytes) -> None:
        with self._lock:
            view = memoryview(frame)
            while view and not self._closed:
                try:
                    view = view[os.write(self._fd, view) :]
                except BlockingIOError:
                    self._wait_writable()
                except OSError:  # peer gone (EPIPE, ENODEV, EBADF, ...)
                    self._closed = True

    def _wait_writable(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLOUT)
        for _fd, revents in poller.poll(WRITE_POLL_MS):
            if revents & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                self._closed = True  # virtio port with the host disconnected: drop the frame

    def close(self) -> None:
        """Stop all writes; once this returns no thread touches the fd any more."""
        self._closed = True
        with self._lock:
            pass


class RunningRequests:
    """The requests of one connection still running, by id, so ``cancel`` can find them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[Any, StreamEmit] = {}

    def add(self, req_id: Any, emit: StreamEmit) -> None:
        if _hashable(req_id):
            with self._lock:
                self._by_id[req_id] = emit

    def discard(self, req_id: Any, emit: StreamEmit) -> None:
        if _hashable(req_id):
            with self._lock:
                if self._by_id.get(req_id) is emit:
                    del self._by_id[req_id]

    def cancel(self, req_id: Any) -> bool:
        if not _hashable(req_id):
            return False
        with self._lock:
            emit = self._by_id.get(req_id)
        if emit is None:
            return False
        emit.cancelled.set()
        return True

    def cancel_all(self) -> None:
        with self._lock:
            emits = list(self._by_id.values())
        for emit in emits:
            emit.cancelled.set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)


class StreamEmit:
    """What a request's handler gets as ``emit``: ``emit(event, data)`` sends an event; ``cancelled`` is set when
    the host cancels the request (or its connection ends)."""

    def __init__(self, send: Emit | None = None, running: RunningRequests | None = None) -> None:
        self._send = send
        self.running = running  # the requests of this one's connection: what a ``cancel`` sent on it acts on
        self.cancelled = threading.Event()

    def __call__(self, event: str, data: bytes) -> None:
        if self._send is not None:
            self._send(event, data)


def _hashable(value: Any) -> bool:
    return value is None or isinstance(value, int | str | float)


def read_frames(fd: int) -> Iterator[dict[str, Any]]:
    """Yield decoded frames from a non-blocking fd until EOF; raise FrameError on garbage."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    buf = bytearray()
    while True:
        try:
            chunk = os.read(fd, READ_SIZE)
        except BlockingIOError:
            events = poller.poll()
            if events and all(ev & select.POLLHUP and not ev & select.POLLIN for _, ev in events):
                # a virtio-serial port whose host went away: reads say "again", poll says "hang-up" at once,
                # forever; that is the end of the session (looping here spun a TCG guest's vCPU flat out)
                if buf:
                    raise FrameError(f"connection closed inside a frame ({len(buf)} bytes pending)") from None
                return
            continue
        if not chunk:
            if buf:
                raise FrameError(f"connection closed inside a frame ({len(buf)} bytes pending)")
            return
        buf += chunk
        while len(buf) >= HEADER.size:
            length = decode_length(bytes(buf[: HEADER.size]))
            end = HEADER.size + length
            if len(buf) < end:
                break
            body = bytes(buf[HEADER.size : end])
            del buf[:end]
            yield decode_body(body)


class GuestAgent:
    """Dispatches requests to ops.

    ``clock_setter`` replaces the real CLOCK_REALTIME setter, ``resume_system`` what ``resume`` touches besides
    the clock (neighbour table, resolvers, RNG, paths) and ``inspect_sources`` where ``inspect_net`` reads
    from. Tests replace all three; the defaults act on the machine the agent runs on.
    """

    def __init__(
        self,
        clock_setter: ClockSetter | None = None,
        resume_system: ResumeSystem | None = None,
        inspect_sources: InspectSources | None = None,
    ) -> None:
        self._clock_setter = clock_setter or set_realtime_clock
        self._ops: dict[str, Handler] = {
            "ping": self._op_ping,
            "set_clock": self._op_set_clock,
            "exec": ops_exec.op_exec,
            "resume": Resumer(self._clock_setter, resume_system),
            "inspect_net": NetInspector(inspect_sources),
            "cancel": self._op_cancel,
            "watch_dir": op_watch_dir,
            "volumes_settle": VolumeSettler(resume_system.volumes if resume_system is not None else None),
        }
        holds = VolumeHolds(resume_system.volumes if resume_system is not None else None)
        self._ops.update(volumes_release=holds.release_op, volumes_mount=holds.mount_op)
        for name, op in FILE_OPS.items():
            self.register(name, _without_events(op))
        self.pty = PtySessions()
        self.procs = ProcTable()
        self.watchers = WatcherTable()
        for table in (self.pty, self.procs, self.watchers):
            for name, handler in table.handlers().items():
                self.register(name, handler)

    @property
    def ops(self) -> list[str]:
        return sorted(self._ops)

    def register(self, name: str, handler: Handler) -> None:
        self._ops[name] = handler

    # --- serving ---------------------------------------------------------------------------------------

    def serve_fd(self, fd: int) -> int:
        """Serve requests from ``fd`` until EOF or a bad frame; return how many requests arrived.

        The fd is not closed; when this returns, no request thread will write to it any more.
        """
        was_blocking = os.get_blocking(fd)
        os.set_blocking(fd, False)
        conn = Connection(fd)
        running = RunningRequests()
        count = 0
        try:
            for message in read_frames(fd):
                count += 1
                emit = self._stream_emit(conn, running, message.get("id"))
                if message.get("op") in INLINE_OPS:  # cheap and latency-critical: no thread start
                    self._serve_request(conn, message, emit)
                    continue
                running.add(message.get("id"), emit)  # before the thread starts: a cancel right behind finds it
                threading.Thread(
                    target=self._serve_request,
                    args=(conn, message, emit, running),
                    name="cryobox-request",
                    daemon=True,
                ).start()
        except FrameError as err:
            log(f"dropping connection: {err}")
        except OSError as err:
            log(f"connection read failed: {err}")
        finally:
            running.cancel_all()  # nobody reads their events any more: streams that would run forever end
            conn.close()
            try:
                os.set_blocking(fd, was_blocking)
            except OSError:
                pass
        return count

    def serve_socket(self, sock: socket.socket) -> int:
        """Serve a connected socket (e.g. one end of ``socket.socketpair()``) until the peer closes it."""
        return self.serve_fd(sock.fileno())

    def _stream_emit(self, conn: Connection, running: RunningRequests, req_id: Any) -> StreamEmit:
        def send(event: str, data: bytes) -> None:
            conn.send({"id": req_id, "event": event, "data": base64.b64encode(data).decode("ascii")})

        return StreamEmit(send, running)

    def _serve_request(
        self, conn: Connection, message: dict[str, Any], emit: StreamEmit, running: RunningRequests | None = None
    ) -> None:
        req_id = message.get("id")
        try:
            reply = self.handle(message, emit)
            try:
                conn.send(reply)
            except (FrameError, TypeError, ValueError) as err:
                conn.send(_error(req_id, "internal", f"cannot encode reply: {err}"))
        except Exception as err:  # never let a request kill the agent
            log(f"request {req_id!r} failed while replying: {err!r}")
        finally:
            if running is not None:
                running.discard(req_id, emit)

    # --- dispatch --------------------------------------------------------------------------------------

    def handle(self, message: dict[str, Any], emit: Emit | None = None) -> dict[str, Any]:
        """Run one request and return its final reply (events, if any, go to ``emit``)."""
        req_id = message.get("id")
        try:
            op = message.get("op")
            args = message.get("args")
            if args is None:
                args = {}
            if not isinstance(op, str):
                raise invalid("request has no 'op' string")
            if not isinstance(args, dict):
                raise invalid("'args' must be an object")
            handler = self._ops.get(op)
            if handler is None:
                raise invalid(f"unknown op {op!r}")
            result = handler(args, emit if emit is not None else StreamEmit())
        except OpError as err:
            return _error(req_id, err.code, err.message)
        except OSError as err:
            mapped = error_from_oserror(err)
            return _error(req_id, mapped.code, mapped.message)
        except Exception as err:
            return _error(req_id, "internal", f"{type(err).__name__}: {err}")
        return {"id": req_id, "ok": True, "result": result}

    def _op_ping(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        return {"pong": True, "pid": os.getpid(), "time_ns": time.time_ns(), "version": AGENT_VERSION}

    def _op_cancel(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        """Cancel the running request ``args["request"]`` of this connection; False if there is none."""
        if "request" not in args:
            raise invalid("'request' must be a request id")
        if not isinstance(emit, StreamEmit) or emit.running is None:
            return {"cancelled": False}
        return {"cancelled": emit.running.cancel(args["request"])}

    def _op_set_clock(self, args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        epoch_ns = args.get("epoch_ns")
        if isinstance(epoch_ns, bool) or not isinstance(epoch_ns, int) or epoch_ns < 0:
            raise invalid("'epoch_ns' must be a non-negative integer")
        before = time.time_ns()
        try:
            self._clock_setter(epoch_ns)
        except PermissionError as err:
            raise OpError("permission_denied", f"cannot set the clock: {err}") from err
        return {"before_ns": before, "after_ns": time.time_ns()}


def _error(req_id: Any, code: str, message: str) -> dict[str, Any]:
    return {"id": req_id, "ok": False, "error": {"code": code, "message": message}}


def _without_events(op: FileOp) -> Handler:
    def handler(args: dict[str, Any], emit: Emit) -> dict[str, Any]:
        return op(args)

    return handler
