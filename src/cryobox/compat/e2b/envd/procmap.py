"""E2B's process messages ↔ the agent's process models (:mod:`cryobox.agentapi.models_procs`), as envd means them.

- ``StartRequest.stdin`` is proto3 ``optional``: absent means ``true`` (envd keeps a stdin pipe for old clients;
  the SDK sends ``false`` unless asked). A PTY process takes its input through the terminal either way.
- No ``cwd`` means the user's home (envd's default workdir); a relative one is under it.
- An end event carries ``exit_code`` (-1 when signalled), ``exited`` (ended by exit, not by a signal),
  ``status`` (``exit status 1``, ``signal: killed``) and ``error`` for anything but a clean exit 0, which is what
  the SDK's ``CommandExitException`` shows.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping
from typing import Literal

from protobuf import Oneof

from ....agentapi import models_procs as mp
from ....errors import InvalidArgument
from .gen.process import process_pb as pb
from .session import Target

MAX_INPUT_CHUNK = 6 << 20
"""Raw bytes per ``proc_input`` call (their base64 is the model's 8 MiB bound); bigger inputs go in order."""

SIGNALS: Mapping[pb.Signal, int] = {pb.Signal.SIGTERM: 15, pb.Signal.SIGKILL: 9}
SIGKILL = 9


def selector(process: pb.ProcessSelector | None) -> mp.ProcSelector:
    match process.selector if process is not None else None:
        case Oneof(field="pid", value=int() as pid):
            return mp.ProcSelector(pid=pid)
        case Oneof(field="tag", value=str() as tag):
            return mp.ProcSelector(tag=tag)
    raise InvalidArgument("the process selector needs a pid or a tag")


def pty_size(pty: pb.PTY | None) -> mp.PtySize | None:
    if pty is None:
        return None
    size = pty.size
    defaults = mp.PtySize()
    if size is None:
        return defaults
    return mp.PtySize(cols=size.cols or defaults.cols, rows=size.rows or defaults.rows)


def start_spec(request: pb.StartRequest, target: Target) -> mp.ProcStart:
    config = request.process
    if config is None or not config.cmd:
        raise InvalidArgument("the process config needs a cmd")
    # no user or directory named: the image's USER and WORKDIR when its template has them, else E2B's defaults
    cwd = target.resolve(config.cwd) if config.has_field("cwd") and config.cwd else None
    if cwd is None and target.named:
        cwd = target.home
    return mp.ProcStart(
        cmd=config.cmd,
        args=list(config.args),
        env=dict(config.envs),
        cwd=cwd,
        user=target.user if target.named else None,
        default_user=None if target.named else target.user,
        tag=request.tag if request.has_field("tag") and request.tag else None,
        pty=pty_size(request.pty),
        stdin=request.stdin if request.has_field("stdin") else True,
    )


def _end(event: mp.ProcEvent) -> pb.ProcessEvent.EndEvent:
    code = event.exit_code if event.exit_code is not None else -1
    signalled = code < 0 or event.status.startswith("signal")
    status = event.status or (f"exit status {code}" if not signalled else "signal: killed")
    error = event.error if event.error is not None else (status if code != 0 or signalled else None)
    return pb.ProcessEvent.EndEvent(exit_code=code, exited=not signalled, status=status, error=error)


def _data(event: mp.ProcEvent) -> pb.ProcessEvent.DataEvent:
    raw = base64.b64decode(event.data_b64)
    if event.kind == "stdout":
        stdout: Oneof[Literal["stdout"], bytes] = Oneof("stdout", raw)
        return pb.ProcessEvent.DataEvent(output=stdout)
    if event.kind == "stderr":
        stderr: Oneof[Literal["stderr"], bytes] = Oneof("stderr", raw)
        return pb.ProcessEvent.DataEvent(output=stderr)
    pty: Oneof[Literal["pty"], bytes] = Oneof("pty", raw)
    return pb.ProcessEvent.DataEvent(output=pty)


def process_event(event: mp.ProcEvent) -> pb.ProcessEvent:
    """One agent event as envd's ``ProcessEvent`` (output bytes decoded from base64)."""
    if event.kind == "start":
        start: Oneof[Literal["start"], pb.ProcessEvent.StartEvent] = Oneof(
            "start", pb.ProcessEvent.StartEvent(pid=event.pid or 0)
        )
        return pb.ProcessEvent(event=start)
    if event.kind == "end":
        end: Oneof[Literal["end"], pb.ProcessEvent.EndEvent] = Oneof("end", _end(event))
        return pb.ProcessEvent(event=end)
    data: Oneof[Literal["data"], pb.ProcessEvent.DataEvent] = Oneof("data", _data(event))
    return pb.ProcessEvent(event=data)


def keepalive() -> pb.ProcessEvent:
    event: Oneof[Literal["keepalive"], pb.ProcessEvent.KeepAlive] = Oneof("keepalive", pb.ProcessEvent.KeepAlive())
    return pb.ProcessEvent(event=event)


def process_info(info: mp.ProcInfo) -> pb.ProcessInfo:
    config = pb.ProcessConfig(cmd=info.cmd, args=list(info.args), envs=dict(info.env), cwd=info.cwd)
    return pb.ProcessInfo(config=config, pid=info.pid, tag=info.tag)


def input_bytes(value: pb.ProcessInput | None) -> bytes:
    """The bytes of a ``ProcessInput`` (stdin or terminal: the guest knows which the process has)."""
    match value.input if value is not None else None:
        case Oneof(field="stdin" | "pty", value=bytes() as data):
            return data
    raise InvalidArgument("the process input needs stdin or pty bytes")


def input_requests(process: mp.ProcSelector, data: bytes) -> Iterator[mp.ProcInput]:
    """``data`` for ``process`` as ``proc_input`` calls of at most :data:`MAX_INPUT_CHUNK` bytes each."""
    for offset in range(0, max(len(data), 1), MAX_INPUT_CHUNK):  # empty input still names (and checks) it
        chunk = data[offset : offset + MAX_INPUT_CHUNK]
        yield mp.ProcInput(process=process, data_b64=base64.b64encode(chunk).decode("ascii"))


def signal_number(signal: pb.Signal) -> int:
    number = SIGNALS.get(signal)
    if number is None:
        raise InvalidArgument(f"unsupported signal {signal!r}: use SIGTERM or SIGKILL")
    return number
