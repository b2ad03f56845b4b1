"""A real, throwaway PostgreSQL server for tests (plain module, not a conftest).

``CRYOBOX_TEST_POSTGRES_URL`` (a server where the user may ``CREATE DATABASE``) is used as is when set. Otherwise
the Debian ``postgresql`` package's binaries under ``/usr/lib/postgresql/<version>/bin`` create a cluster in a
temporary directory and serve it on a unix socket only (``listen_addresses=''``: no TCP at all). As root (initdb
refuses to run as root) the binaries run as the ``postgres`` system user through ``runuser``. The server is
stopped and its directory removed on exit, also after failures.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

from cryobox.registry import normalize_url

ENV_URL = "CRYOBOX_TEST_POSTGRES_URL"
PG_ROOT = Path("/usr/lib/postgresql")
# The port only names the socket file (.s.PGSQL.<port>) in our private socket directory: with no TCP listener
# and PostgreSQL >= 12 keying shared memory on the data directory, any number is free there.
SOCKET_PORT = 5432
START_TIMEOUT_S = 60


@dataclass
class PostgresServer:
    admin_url: URL
    """Where ``CREATE DATABASE`` / ``DROP DATABASE`` are run (autocommit)."""

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """A fresh, empty database for one test: yields its SQLAlchemy URL, drops it afterwards."""
        name = f"cbx_test_{secrets.token_hex(6)}"
        admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
            try:
                yield self.admin_url.set(database=name).render_as_string(hide_password=False)
            finally:
                with admin.connect() as conn:
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        finally:
            admin.dispose()


def find_bindir() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with initdb and pg_ctl; fails the test when there is none."""

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", path.parent.name))

    candidates = [p.parent for p in PG_ROOT.glob("*/bin/initdb") if (p.parent / "pg_ctl").exists()]
    if not candidates:
        pytest.fail(
            f"PostgreSQL server binaries (initdb, pg_ctl) not found under {PG_ROOT}/*/bin: install the Debian "
            f"'postgresql' package (`make apt` does) or set {ENV_URL} to a server where tests may create databases",
            pytrace=False,
        )
    return max(candidates, key=lambda p: version(p / "initdb"))


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(_as_postgres(cmd), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}", pytrace=False)


def _kill_leftover(data_dir: Path) -> None:
    """Last resort after a failed ``pg_ctl stop``: SIGKILL the postmaster we started (its backends follow)."""
    pid_file = data_dir / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int(pid_file.read_text().splitlines()[0])
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[PostgresServer]:
    external = os.environ.get(ENV_URL, "").strip()
    if external:
        yield PostgresServer(admin_url=make_url(normalize_url(external)))
        return

    bindir = find_bindir()
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root needs the 'postgres' system user (Debian's postgresql package adds it)")
    root = Path(tempfile.mkdtemp(prefix="cbxpg-", dir="/tmp"))  # short: unix socket paths are limited to 107 bytes
    data_dir = root / "data"
    log = root / "postgres.log"
    started = False
    try:
        if os.geteuid() == 0:
            os.chown(root, owner.pw_uid, owner.pw_gid)
        _run(
            [str(bindir / "initdb"), "-D", str(data_dir), "-A", "trust", "-U", "postgres", "-E", "UTF8"]
            + ["--locale=C", "--no-sync"],
            "initdb",
        )
        options = (
            f"-k {root} -p {SOCKET_PORT} -c listen_addresses='' "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            # dynamic shared memory in the data dir, not /dev/shm: a killed server leaves nothing outside its dir
            " -c dynamic_shared_memory_type=mmap"
        )
        started = True  # from here on a server may be running, whatever pg_ctl says
        proc = subprocess.run(
            _as_postgres(
                [str(bindir / "pg_ctl"), "-D", str(data_dir), "-l", str(log), "-o", options]
                + ["-w", "-t", str(START_TIMEOUT_S), "start"]
            ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S + 30,
        )
        if proc.returncode != 0:
            server_log = log.read_text(errors="replace") if log.exists() else "(no log)"
            pytest.fail(f"pg_ctl start failed:\n{proc.stdout}\n{proc.stderr}\n{server_log}", pytrace=False)
        url = URL.create(
            "postgresql+psycopg",
            username="postgres",
            database="postgres",
            query={"host": str(root), "port": str(SOCKET_PORT)},
        )
        yield PostgresServer(admin_url=url)
    finally:
        if started:
            stop = subprocess.run(
                _as_postgres([str(bindir / "pg_ctl"), "-D", str(data_dir), "-m", "immediate", "-w", "stop"]),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=60,
            )
            if stop.returncode != 0:
                _kill_leftover(data_dir)
        shutil.rmtree(root, ignore_errors=True)
