"""The control plane's side of :mod:`cryobox.objstore.owners`: it announces its registry in the object store
when it starts, claims each snapshot and hibernation before an agent stores it, and releases the claim after the
stored copy is deleted — so ``cryobox gc --store`` can delete what a registry that is gone had stored.

Claims are best effort where losing one costs nothing but disk: a failed announce or release is logged (the GC
keeps what it cannot judge). A failed claim fails the store that follows it, which is retried like any failed
store: an image is never stored unclaimed by this control plane.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy.engine import make_url

from ...errors import CryoboxError
from ...objstore import owners
from ...objstore.client import ObjectStore
from ...registry.oracle import machine_id
from ...registry.repo import Registry

log = logging.getLogger(__name__)


def registry_record(registry: Registry, machine: str) -> owners.RegistryRecord:
    """How ``registry`` announces itself: a SQLite file by its absolute path on ``machine``, PostgreSQL by URL."""
    url = make_url(registry.database.engine.url)
    if url.get_backend_name() == "sqlite":
        locator = str(Path(url.database or "").resolve())
        return owners.RegistryRecord(registry.identity(), "sqlite", locator, machine)
    return owners.RegistryRecord(registry.identity(), "postgres", registry.url, machine)


class StoreOwnership:
    """Claims in ``objects`` for the registry ``record`` names."""

    def __init__(self, objects: ObjectStore, record: owners.RegistryRecord) -> None:
        self.objects = objects
        self.record = record

    @classmethod
    def announced(cls, objects: ObjectStore, registry: Registry, machine: str | None = None) -> StoreOwnership:
        """Announce ``registry`` in ``objects`` (blocking; a failure is logged, the claims still go on)."""
        record = registry_record(registry, machine_id() if machine is None else machine)
        ownership = cls(objects, record)
        try:
            owners.announce(objects, record)
        except (CryoboxError, OSError) as err:
            log.warning("announcing registry %s in the object store failed: %s", record.id, err)
        return ownership

    def claim(self, prefix: str) -> None:
        """Before ``prefix`` is stored (blocking; raises: the store must not go ahead unclaimed)."""
        owners.claim(self.objects, self.record.id, prefix)

    def release(self, prefix: str) -> None:
        """After ``prefix``'s stored copy was deleted (blocking; a failure is logged: the GC drops stale claims)."""
        try:
            owners.release(self.objects, self.record.id, prefix)
        except (CryoboxError, OSError) as err:
            log.warning("releasing the claim on %s failed: %s", prefix, err)
