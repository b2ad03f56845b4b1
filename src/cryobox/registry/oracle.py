"""The registries a store GC consults (:class:`cryobox.objstore.owners.Oracle`): what a registry that claimed
stored images holds now, read from its database.

- A **SQLite** registry (a ``serve`` data dir) is judged only on the machine it announced (``/etc/machine-id``):
  its file missing, or holding another registry (a data dir made again at the same path), reads as ``gone``;
  otherwise it is opened read-only and its snapshot, sandbox and volume ids and template names are read.
- A **PostgreSQL** registry is consulted when this run was given its URL (``cryobox gc --store --database-url``)
  and the database there has the announced id; any other reads as ``unknown`` and its images are kept (a fleet's
  database that is down for a moment must never look gone).

Every failure to read reads as ``unknown``: the GC keeps what it cannot judge.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError, ProgrammingError, SQLAlchemyError

from ..errors import CryoboxError
from ..objstore.owners import UNKNOWN, Listing, RegistryRecord
from .db import make_engine

log = logging.getLogger(__name__)

MACHINE_ID = Path("/etc/machine-id")
_IDENTITY = text("SELECT value FROM registry_meta WHERE key = 'registry_id'")
_LISTED = text(
    "SELECT 'snapshots', id FROM snapshots UNION ALL SELECT 'sandboxes', id FROM sandboxes"
    " UNION ALL SELECT 'templates', name FROM templates UNION ALL SELECT 'volumes', id FROM volumes"
)
"""Everything a registry lists, in one statement: one snapshot of the database on either backend. Read table by
table (PostgreSQL gives each statement a snapshot of its own, and a plain SQLite connection reads each outside a
transaction), a commit between two reads that moved a reference from a table read later to one read earlier hid
it from both."""


def machine_id(path: Path = MACHINE_ID) -> str:
    """This machine's id (``/etc/machine-id``), or ``""`` when it has none (then no SQLite registry is judged)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class RegistryOracle:
    """Consults SQLite registries on this machine and the PostgreSQL registries at ``database_urls``."""

    def __init__(self, machine: str, database_urls: Sequence[str] = ()) -> None:
        self.machine = machine
        self.database_urls = list(database_urls)

    def consult(self, record: RegistryRecord) -> Listing:
        try:
            if record.kind == "sqlite":
                return self._sqlite(record)
            return self._postgres(record)
        except (SQLAlchemyError, CryoboxError, OSError) as err:
            log.warning("registry %s (%s) cannot be read: its images are kept (%s)", record.id, record.locator, err)
            return UNKNOWN

    def _sqlite(self, record: RegistryRecord) -> Listing:
        if not self.machine or record.machine != self.machine:
            return UNKNOWN
        path = Path(record.locator)
        if not path.is_absolute():
            return UNKNOWN
        if not path.exists():
            return Listing("gone")
        url = URL.create("sqlite", database=f"file:{path}?mode=ro", query={"uri": "true"})
        engine = create_engine(url)
        try:
            return _read(engine, record.id)
        except (OperationalError, ProgrammingError) as err:
            if "no such table" in str(err):  # a database from before 0015, or not a registry: not the one announced
                return Listing("gone")
            raise
        finally:
            engine.dispose()

    def _postgres(self, record: RegistryRecord) -> Listing:
        for url in self.database_urls:
            engine = make_engine(url)
            try:
                found = _read(engine, record.id)
            finally:
                engine.dispose()
            if found.state == "live":
                return found
        return UNKNOWN


def _read(engine: Engine, registry_id: str) -> Listing:
    """The listing of the registry in ``engine`` if it is ``registry_id``; ``gone`` if it is another one."""
    with engine.connect() as conn:
        found = conn.execute(_IDENTITY).scalar_one_or_none()
        if found != registry_id:
            return Listing("gone")
        listed: dict[str, set[str]] = {"snapshots": set(), "sandboxes": set(), "templates": set(), "volumes": set()}
        for table, key in conn.execute(_LISTED):
            listed[str(table)].add(str(key))
    return Listing(
        "live",
        snapshots=frozenset(listed["snapshots"]),
        sandboxes=frozenset(listed["sandboxes"]),
        templates=frozenset(listed["templates"]),
        volumes=frozenset(listed["volumes"]),
    )
