"""A guest's file-system answers -> wire models."""

from __future__ import annotations

from typing import Any

from ... import models


def file_entry(raw: dict[str, Any]) -> models.FileEntry:
    return models.FileEntry(
        name=str(raw["name"]),
        is_dir=bool(raw["is_dir"]),
        size=int(raw["size"]),
        mode=int(raw["mode"]),
        mtime=float(raw["mtime"]),
    )
