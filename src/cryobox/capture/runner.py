"""``cryobox capture``: run a test command in a fresh sandbox and keep the machine when it fails or hangs.

The flow (``CaptureRunner.run``): build a tar.gz of the project on the host, create a sandbox with a TTL, upload
and extract it into ``/work``, run ``--setup`` there, then start the test command *detached* (its own session,
output in ``/work/.cryobox/test.log``, pid in ``/work/.cryobox/pid``, exit status in ``/work/.cryobox/exit_code``)
and poll until it is done or the deadline passes:

* green (exit 0): the sandbox is killed; nothing is left behind;
* red (exit != 0) or hang (still running at the deadline): provenance is written into the guest as
  ``/failure.json`` (and as snapshot labels), the *running* machine is snapshotted with ``retain`` (a hung test is
  still blocked inside it), the test log is added to the snapshot's evidence, and the sandbox is left running
  (its TTL reaps it) so that nothing about the failure is lost before someone looks.

The runner talks to the platform only through the small ``GuestSandbox`` protocol and two callables, so its
decisions are unit-tested with a fake sandbox (tests/unit/capture/test_runner.py).
"""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlparse

from .. import models
from ..sdk import ExecResult

STATE_DIR = "/work/.cryobox"
LOG_PATH = f"{STATE_DIR}/test.log"
PID_PATH = f"{STATE_DIR}/pid"
EXIT_PATH = f"{STATE_DIR}/exit_code"
ARCHIVE_PATH = f"{STATE_DIR}/upload.tar.gz"
FAILURE_PATH = "/failure.json"
HANG_EXIT = 124  # like timeout(1)
SETUP_EXIT = 3  # --setup failed: nothing was captured
EXCLUDES = frozenset({".git", ".venv", "__pycache__", "node_modules", ".cryobox"})
INNER_ENV = "CRYOBOX_CAPTURE_INNER"
LABEL_MAX = 1024
WAIT_CHUNK_S = 10.0  # longest single in-guest wait for the exit file

Outcome = Literal["passed", "failed", "hang", "setup_failed"]


class GuestFiles(Protocol):
    def write(self, path: str, data: str | bytes) -> int: ...
    def read(self, path: str) -> bytes: ...


class GuestSandbox(Protocol):
    """What the runner needs of a sandbox (``cryobox.Sandbox`` satisfies it)."""

    @property
    def id(self) -> str: ...
    @property
    def info(self) -> models.Sandbox: ...
    @property
    def filesystem(self) -> GuestFiles: ...
    def exec(
        self,
        cmd: str,
        *,
        timeout_seconds: float | None = ...,
        env: Mapping[str, str] | None = ...,
        cwd: str | None = ...,
    ) -> ExecResult: ...
    def snapshot(self, labels: Mapping[str, str] | None = ..., *, retain: bool = ...) -> models.Snapshot: ...
    def kill(self) -> None: ...
    def close(self) -> None: ...


CreateSandbox = Callable[[str, int], GuestSandbox]  # (template, ttl_seconds) -> a running sandbox
PutEvidence = Callable[[str, str, bytes], int]  # (snapshot_id, name, data) -> size


@dataclass(frozen=True)
class CaptureOptions:
    template: str
    command: str
    upload: Path
    setup: str | None = None
    timeout_s: float = 600.0
    ttl_s: int = 3600
    seed: int | None = None
    setup_timeout_s: float = 600.0


@dataclass
class CaptureResult:
    outcome: Outcome
    exit_code: int | None
    sandbox_id: str
    duration_s: float
    snapshot_id: str | None = None
    log: bytes = b""
    provenance: dict[str, Any] | None = None
    setup_output: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        """The exit code ``cryobox capture`` mirrors: the test's, 124 for a hang, 3 for a failed setup."""
        if self.outcome == "hang":
            return HANG_EXIT
        if self.outcome == "setup_failed":
            return SETUP_EXIT
        return self.exit_code or 0

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "snapshot_id": self.snapshot_id,
            "sandbox_id": self.sandbox_id,
            "duration_s": round(self.duration_s, 3),
            "provenance": self.provenance,
        }


# --- host side helpers -------------------------------------------------------------------------------------------


def _excluded(name: str) -> bool:
    return name in EXCLUDES


def build_tarball(root: Path, excludes: Iterable[str] = EXCLUDES) -> bytes:
    """A tar.gz of ``root``'s contents (paths relative to it), without ``.git``, ``.venv``, ``__pycache__``,
    ``node_modules`` (at any depth)."""
    skip = frozenset(excludes)

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if any(part in skip for part in Path(info.name).parts):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name, filter=keep)
    return buffer.getvalue()


def git_commit(root: Path) -> str | None:
    """``git rev-parse HEAD`` of ``root`` when it is in a git work tree, else ``None``."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def detached_command(command: str) -> str:
    """The shell command that starts ``command`` in its own session and returns at once.

    Inside: output to ``test.log``, the command's pid to ``pid`` (a simple command is exec'd directly by the
    subshell, so the pid is the test process itself), the exit status written atomically to ``exit_code``.
    """
    inner = (
        f"exec </dev/null >{LOG_PATH} 2>&1; "
        f"( {command}\n) & echo $! > {PID_PATH}; "
        f"wait $!; echo $? > {EXIT_PATH}.tmp && mv {EXIT_PATH}.tmp {EXIT_PATH}"
    )
    return f"mkdir -p {STATE_DIR} && setsid sh -c {shlex.quote(inner)} </dev/null >/dev/null 2>&1 &"


def wait_command(seconds: float) -> str:
    """Exits 0 as soon as the exit file exists, 1 after ``seconds`` without it."""
    polls = max(1, int(seconds / 0.25))
    return f"i=0; while [ ! -f {EXIT_PATH} ]; do i=$((i+1)); [ $i -gt {polls} ] && exit 1; sleep 0.25; done; exit 0"


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def provenance_labels(provenance: Mapping[str, Any]) -> dict[str, str]:
    """Snapshot labels (strings) mirroring ``/failure.json``; ``None`` values are left out."""
    labels = {"cryobox.capture": str(provenance["kind"])}
    for key, value in provenance.items():
        if value is not None:
            labels[key] = str(value)[:LABEL_MAX]
    return labels


# --- the runner --------------------------------------------------------------------------------------------------


class CaptureRunner:
    """Runs one capture. ``create`` makes the sandbox, ``put_evidence`` stores a file beside a snapshot;
    ``clock`` / ``sleep`` / ``now`` are injectable for tests; ``log`` receives progress lines."""

    def __init__(
        self,
        create: CreateSandbox,
        put_evidence: PutEvidence,
        *,
        api_url: str = "",
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self._create = create
        self._put_evidence = put_evidence
        self._api_url = api_url
        self._clock = clock
        self._now = now
        self._log = log

    def run(self, options: CaptureOptions) -> CaptureResult:
        started = self._clock()
        archive = build_tarball(options.upload)
        commit = git_commit(options.upload)
        self._log(f"uploading {options.upload} ({len(archive)} bytes) to a {options.template!r} sandbox")
        sbx = self._create(options.template, options.ttl_s)
        env = {INNER_ENV: "1"}
        if options.seed is not None:
            env["CRYOBOX_SEED"] = str(options.seed)
        try:
            self._upload(sbx, archive)
            if options.setup:
                setup = sbx.exec(options.setup, timeout_seconds=options.setup_timeout_s, env=env, cwd="/work")
                if setup.exit_code != 0:
                    sbx.kill()  # nothing ran yet: there is nothing to debug in this machine
                    return CaptureResult(
                        "setup_failed",
                        setup.exit_code,
                        sbx.id,
                        self._clock() - started,
                        setup_output=setup.stdout + setup.stderr,
                        notes=["setup failed; the sandbox was killed (nothing to debug yet)"],
                    )
            sbx.exec(detached_command(options.command), timeout_seconds=60, env=env, cwd="/work")
        except BaseException:
            sbx.kill()
            raise
        test_started = self._clock()
        self._log(f"running in sandbox {sbx.id}: {options.command}")
        try:
            done = self._wait(sbx, test_started + options.timeout_s)
        except BaseException:
            sbx.close()  # the test is running: leave the machine to its TTL rather than destroy evidence
            raise
        if done:
            exit_code = int(sbx.filesystem.read(EXIT_PATH).decode().strip() or "1")
            log = self._read_log(sbx)
            if exit_code == 0:
                sbx.kill()
                return CaptureResult("passed", 0, sbx.id, self._clock() - started, log=log)
            return self._capture(sbx, options, commit, "failure", exit_code, started, log)
        return self._capture(sbx, options, commit, "hang", None, started, self._read_log(sbx))

    def _upload(self, sbx: GuestSandbox, archive: bytes) -> None:
        sbx.filesystem.write(ARCHIVE_PATH, archive)
        extract = sbx.exec(
            f"mkdir -p /work && tar -xzf {ARCHIVE_PATH} -C /work && rm -f {ARCHIVE_PATH}", timeout_seconds=300
        )
        if extract.exit_code != 0:
            raise RuntimeError(f"extracting the upload failed: {extract.stderr.strip()}")

    def _wait(self, sbx: GuestSandbox, deadline: float) -> bool:
        """``True`` once the exit file exists, ``False`` when the deadline passed first."""
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                # one last look: the test may have finished right at the deadline
                return sbx.exec(f"test -f {EXIT_PATH}", timeout_seconds=30).exit_code == 0
            chunk = min(WAIT_CHUNK_S, remaining)
            if sbx.exec(wait_command(chunk), timeout_seconds=chunk + 30).exit_code == 0:
                return True

    @staticmethod
    def _read_log(sbx: GuestSandbox) -> bytes:
        try:
            return sbx.filesystem.read(LOG_PATH)
        except Exception:  # noqa: BLE001 (a missing log must not lose the capture)
            return b""

    def _capture(
        self,
        sbx: GuestSandbox,
        options: CaptureOptions,
        commit: str | None,
        kind: Literal["failure", "hang"],
        exit_code: int | None,
        started: float,
        log: bytes,
    ) -> CaptureResult:
        pid_text = sbx.filesystem.read(PID_PATH).decode().strip()
        provenance: dict[str, Any] = {
            "kind": kind,
            "commit": commit,
            "seed": options.seed,
            "command": options.command,
            "exit_code": exit_code,
            "captured_at": rfc3339(self._now()),
            "host": sbx.info.host or urlparse(self._api_url).hostname,
            "template": options.template,
            "pid": int(pid_text) if pid_text.isdigit() else None,
            "sandbox_id": sbx.id,
        }
        sbx.filesystem.write(FAILURE_PATH, json.dumps(provenance, indent=2) + "\n")
        snap = sbx.snapshot(provenance_labels(provenance), retain=True)
        notes: list[str] = []
        for name, data in (("test.log", log), ("failure.json", json.dumps(provenance, indent=2).encode())):
            try:
                self._put_evidence(snap.id, name, data)
            except Exception as error:  # noqa: BLE001 (the snapshot is taken: report, do not fail the capture)
                notes.append(f"could not store evidence {name}: {error}")
        sbx.close()  # not kill: the machine stays up until its TTL
        outcome: Outcome = "hang" if kind == "hang" else "failed"
        return CaptureResult(
            outcome,
            exit_code,
            sbx.id,
            self._clock() - started,
            snapshot_id=snap.id,
            log=log,
            provenance=provenance,
            notes=notes,
        )


@contextmanager
def sdk_runner(
    api_url: str | None = None, api_key: str | None = None, *, log: Callable[[str], None] = lambda line: None
) -> Iterator[CaptureRunner]:
    """A ``CaptureRunner`` on the real SDK (``api_url`` / ``api_key`` default to ``$CRYOBOX_API_URL`` / ``_KEY``)."""
    from ..sdk import ClientConfig, Sandbox, Snapshots

    config = ClientConfig.resolve(api_url, api_key)

    def create(template: str, ttl_seconds: int) -> GuestSandbox:
        return Sandbox.create(template, ttl_seconds=ttl_seconds, api_url=config.api_url, api_key=config.api_key)

    with Snapshots(api_url=config.api_url, api_key=config.api_key) as snapshots:
        yield CaptureRunner(create, snapshots.put_evidence, api_url=config.api_url, log=log)
