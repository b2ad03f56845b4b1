"""A throwaway PostgreSQL cluster for the control plane (:class:`PostgresProcess`), on a unix socket only."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from .system import kill_pid

PG_ROOT = Path("/usr/lib/postgresql")
PG_SOCKET_PORT = 5432
"""Only names the socket file ``.s.PGSQL.5432`` in the server's private socket directory (no TCP listener)."""


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
                " -c dynamic_shared_memory_type=mmap"  # nothing in /dev/shm, should the server be killed
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
                self.create_database(self.database)
        except BaseException:
            self.stop()
            raise
        return self

    def create_database(self, name: str) -> str:
        """Create database ``name`` in this cluster; returns its URL (as :attr:`url` is the default one's)."""
        if self.root is None or self._bindir is None:
            raise RuntimeError("PostgresProcess not started")
        self._pg(
            [str(self._bindir / "createdb"), "-h", str(self.root), "-p", str(PG_SOCKET_PORT), "-U", "postgres", name],
            "createdb",
        )
        return f"postgresql+psycopg://postgres@/{quote(name)}?host={self.root}&port={PG_SOCKET_PORT}"

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
                    kill_pid(int((data / "postmaster.pid").read_text().splitlines()[0]))
            self._started = False
        shutil.rmtree(root, ignore_errors=True)
        self.root = None

    def __enter__(self) -> PostgresProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
