"""A guest's file-system answers -> wire models."""

from __future__ import annotations

from ... import models
from ...agentapi import models as am


def file_entry(entry: am.FsEntry) -> models.FileEntry:
    return models.FileEntry(
        name=entry.name,
        is_dir=entry.is_dir,
        size=entry.size,
        mode=entry.mode,
        mtime=entry.mtime if entry.mtime is not None else 0.0,
    )
