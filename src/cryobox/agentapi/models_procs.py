"""Wire models of long-lived guest processes, file-system watches and richer file ops.

Re-exported by :mod:`.models`; kept apart so each file stays one concept. A process started with
:class:`ProcStart` lives in the guest independently of any stream: closing a start or connect stream only
detaches, the process keeps running (and keeps running across a snapshot, in every restore and fork of it).
Its output is kept in a bounded buffer in the guest, so a later connect replays what it printed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_SIGNAL = 64


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class PtySize(_Model):
    cols: int = Field(default=80, ge=1, le=10_000)
    rows: int = Field(default=24, ge=1, le=10_000)


class ProcSelector(_Model):
    """A process by pid or by the tag it was started with (exactly one)."""

    pid: int | None = Field(default=None, ge=1)
    tag: str | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _one(self) -> ProcSelector:
        if (self.pid is None) == (self.tag is None):
            raise ValueError("give exactly one of 'pid' or 'tag'")
        return self


class ProcStart(_Model):
    """Run ``cmd`` with ``args`` (no shell unless ``cmd`` is one) as ``user`` (``None``: the image's default user,
    else ``default_user``, else root)."""

    cmd: str = Field(min_length=1, max_length=4096)
    args: list[str] = Field(default_factory=list, max_length=4096)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    user: str | None = Field(default=None, max_length=64)
    default_user: str | None = Field(default=None, max_length=64)
    """Used only when neither ``user`` nor the image's defaults (``/etc/cryobox/defaults.json``) name one."""
    tag: str | None = Field(default=None, min_length=1, max_length=256)
    pty: PtySize | None = None
    stdin: bool = False
    """Keep a pipe to the process's stdin open (``proc_input`` writes to it); otherwise stdin is /dev/null.
    A PTY process always takes input through its terminal."""


class ProcInfo(_Model):
    pid: int
    tag: str | None = None
    cmd: str
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    pty: bool = False
    running: bool = True
    exit_code: int | None = None
    started_at: float = 0.0


class ProcEvent(_Model):
    """One item of a process stream: ``start`` (``pid``), output (``stdout``/``stderr``/``pty`` with base64
    ``data_b64``) or ``end`` (``exit_code``, ``status`` like ``exit status 1`` or ``signal: killed``).

    ``dropped`` on the first output event after a connect says how many bytes the guest's bounded buffer had
    already discarded before the replay starts."""

    kind: Literal["start", "stdout", "stderr", "pty", "end"]
    pid: int | None = None
    data_b64: str = ""
    exit_code: int | None = None
    status: str = ""
    error: str | None = None
    dropped: int = 0


class ProcInput(_Model):
    """Bytes to a process's stdin (or terminal), and/or end of input (``eof``; stdin pipes only)."""

    process: ProcSelector
    data_b64: str = Field(default="", max_length=8 << 20)
    eof: bool = False


class ProcSignal(_Model):
    process: ProcSelector
    signal: int = Field(default=15, ge=1, le=MAX_SIGNAL)


class ProcResize(_Model):
    process: ProcSelector
    size: PtySize


FsOp = Literal["stat", "list_dir", "mkdir", "delete", "move", "watch_create", "watch_events", "watch_remove"]


class FsRequest(_Model):
    """A file-system call beyond read/write. ``stat``/``list_dir`` entries carry ``name``, ``path``, ``type``
    (``file``/``dir``/``symlink``), ``size``, ``mode``, ``permissions``, ``owner``, ``group``, ``mtime`` and
    ``symlink_target``; ``list_dir`` descends ``depth`` levels (1: the directory's own entries).
    ``mkdir`` answers ``created: false`` when the directory already existed. ``move`` renames ``path`` to
    ``destination``. The watcher trio keeps events in the guest for a later ``watch_events`` (by ``watcher``)."""

    op: FsOp
    path: str = Field(default="", max_length=4096)
    destination: str | None = Field(default=None, max_length=4096)
    depth: int = Field(default=1, ge=1, le=64)
    recursive: bool = False
    watcher: str | None = Field(default=None, max_length=64)
    user: str | None = Field(default=None, max_length=64)
    """Own what ``mkdir``/``move`` create as this user (``None``: root)."""


class WatchRequest(_Model):
    path: str = Field(min_length=1, max_length=4096)
    recursive: bool = False


class FsEvent(_Model):
    """``start`` once the watch is in place, then one per change: ``create``, ``write``, ``remove``, ``rename``
    or ``chmod`` of ``name`` (relative to the watched directory)."""

    kind: Literal["start", "create", "write", "remove", "rename", "chmod"]
    name: str = ""
