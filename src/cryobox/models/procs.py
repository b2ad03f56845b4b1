"""Wire models of background processes (``/v1/sandboxes/{id}/processes``), shared by the server and the SDK.

Imported into :mod:`cryobox.models` (use them from there; ``ProcessStartRequest`` sits there, next to
``ExecRequest``); kept apart so each file stays one concept. A process started here lives in the guest
independently of any request: it keeps running when the stream that follows it closes, until it exits or is
signalled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

MAX_SIGNAL = 64
MAX_INPUT_B64 = 8 << 20
"""The most base64 characters one ``stdin`` call may carry (6 MiB of data)."""

# Linux's numbers (the guest's), independent of the host the control plane runs on
SIGNALS: Mapping[str, int] = MappingProxyType({
    "HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "IOT": 6, "BUS": 7, "FPE": 8, "KILL": 9,
    "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15, "STKFLT": 16, "CHLD": 17, "CONT": 18,
    "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22, "URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27,
    "WINCH": 28, "IO": 29, "POLL": 29, "PWR": 30, "SYS": 31,
})  # fmt: skip


def signal_number(value: object) -> int:
    """A signal as its number: ``1``–``64``, a digit string, or a name with or without ``SIG`` (``"SIGTERM"``,
    ``"term"``, ``"KILL"``).

    :raises ValueError: anything else (a 400 on the wire).
    """
    if isinstance(value, bool):
        raise ValueError("signal must be a number or a name like 'SIGTERM'")
    if isinstance(value, str):
        name = value.strip().upper()
        if name.isdigit():
            value = int(name)
        else:
            number = SIGNALS.get(name.removeprefix("SIG"))
            if number is None:
                raise ValueError(f"unknown signal name {value!r} (e.g. 'SIGTERM', 'TERM', 'KILL' or a number)")
            return number
    if not isinstance(value, int) or not 1 <= value <= MAX_SIGNAL:
        raise ValueError(f"signal must be 1-{MAX_SIGNAL} or a name like 'SIGTERM', got {value!r}")
    return value


SignalNumber = Annotated[
    int,
    BeforeValidator(signal_number),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_SIGNAL},
                {"type": "string", "description": "a name: SIGTERM, TERM, KILL, …"},
            ]
        }
    ),
]


class ProcessPty(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cols: int = Field(default=80, ge=1, le=10_000)
    rows: int = Field(default=24, ge=1, le=10_000)


class Process(BaseModel):
    """A background process: ``cmd`` is the shell string it was started with; ``exit_code`` is set once it
    ended (``-1`` when a signal ended it)."""

    pid: int
    tag: str | None = None
    cmd: str
    running: bool
    exit_code: int | None = None
    started_at: str


class ProcessList(BaseModel):
    items: list[Process]


class ProcessInput(BaseModel):
    """``POST …/processes/{pid}/stdin``: ``data`` (text, sent UTF-8) or ``data_b64`` (bytes), and/or ``eof``
    (close its stdin pipe)."""

    model_config = ConfigDict(extra="forbid")
    data: str | None = Field(default=None, max_length=MAX_INPUT_B64)
    data_b64: str | None = Field(default=None, max_length=MAX_INPUT_B64)
    eof: bool = False

    @model_validator(mode="after")
    def _at_most_one(self) -> ProcessInput:
        if self.data is not None and self.data_b64 is not None:
            raise ValueError("give 'data' or 'data_b64', not both")
        return self


class ProcessSignal(BaseModel):
    """``POST …/processes/{pid}/signal``: a number (1–64) or a name (``SIGTERM``, ``TERM``, ``KILL``…)."""

    model_config = ConfigDict(extra="forbid")
    signal: SignalNumber = 15


@dataclass(frozen=True)
class ProcessResult:
    """``POST …/processes/{pid}/wait``: how the process ended and everything it printed (a terminal's output is
    in ``stdout``). ``status`` reads like ``exit status 1`` or ``signal: killed``; ``truncated`` says the output
    passed what one answer holds (the start of it is kept)."""

    pid: int
    exit_code: int
    status: str = ""
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
