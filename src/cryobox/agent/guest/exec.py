"""Running commands in a guest through its agent: one-shot and streamed."""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from ...errors import InvalidArgument
from ...util.encoding import b64, unb64
from .client import EXEC_REPLY, GuestClient

MAX_TIMEOUT_S = 24 * 3600


@dataclass(frozen=True)
class ExecSpec:
    cmd: str
    timeout_s: float | None = 60.0
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    stdin: bytes | None = None
    user: str | None = None
    """Run as this account (``None``: the image's default user, else ``default_user``, else root)."""
    default_user: str | None = None
    """The front door's default account, for when neither the request nor the image
    (``/etc/cryobox/defaults.json``, ``cryobox_guest.defaults``) names one."""

    def to_args(self, stream: bool) -> dict[str, Any]:
        if not self.cmd:
            raise InvalidArgument("cmd must be a non-empty string")
        if self.timeout_s is not None and not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise InvalidArgument(f"timeout_seconds must be in (0, {MAX_TIMEOUT_S}]")
        args: dict[str, Any] = {
            "cmd": self.cmd,
            "timeout_seconds": self.timeout_s,
            "env": self.env,
            "cwd": self.cwd,
            "stdin": b64(self.stdin) if self.stdin is not None else None,
            "stream": stream,
        }
        if self.user is not None:
            args["user"] = self.user
        if self.default_user is not None:
            args["default_user"] = self.default_user
        return args

    @property
    def call_timeout_s(self) -> float | None:
        """How long the host waits for the agent's reply: the guest enforces the timeout, plus slack."""
        return None if self.timeout_s is None else self.timeout_s + 30.0


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_ms: float
    timed_out: bool

    @classmethod
    def from_guest(cls, result: dict[str, Any]) -> ExecResult:
        return cls(
            exit_code=int(result["exit_code"]),
            stdout=unb64(result.get("stdout")).decode(errors="replace"),
            stderr=unb64(result.get("stderr")).decode(errors="replace"),
            duration_ms=float(result.get("duration_ms", 0.0)),
            timed_out=bool(result.get("timed_out")),
        )


async def run_exec(guest: GuestClient, cmd: str | ExecSpec, *, timeout_s: float | None = 60.0) -> ExecResult:
    spec = cmd if isinstance(cmd, ExecSpec) else ExecSpec(cmd=cmd, timeout_s=timeout_s)
    result = await guest.call("exec", spec.to_args(stream=False), timeout=spec.call_timeout_s, max_reply=EXEC_REPLY)
    return ExecResult.from_guest(result)


@dataclass(frozen=True)
class ExecEvent:
    """One streamed item: ``kind`` is ``stdout``/``stderr`` (with ``text``) or ``exit`` (with ``result``)."""

    kind: str
    text: str = ""
    result: ExecResult | None = None


async def stream_exec(guest: GuestClient, spec: ExecSpec) -> AsyncIterator[ExecEvent]:
    decoders = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")}
    async for message in guest.stream("exec", spec.to_args(stream=True)):
        kind = message["event"]
        if kind in decoders:
            text = decoders[kind].decode(unb64(message.get("data")))
            if text:
                yield ExecEvent(kind=kind, text=text)
        elif kind == "result":
            for name, decoder in decoders.items():
                tail = decoder.decode(b"", final=True)
                if tail:
                    yield ExecEvent(kind=name, text=tail)
            yield ExecEvent(kind="exit", result=ExecResult.from_guest(message["result"]))
