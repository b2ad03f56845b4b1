"""API keys: ``CRYOBOX_API_KEY`` if set, else a key generated once into the data dir (mode 0600)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def load_or_create_key(data_dir: Path, env: dict[str, str] | None = None) -> tuple[str, bool]:
    """Return ``(key, generated)``."""
    env = dict(os.environ) if env is None else env
    if env.get("CRYOBOX_API_KEY"):
        return env["CRYOBOX_API_KEY"], False
    path = data_dir / "api_key"
    if path.exists():
        return path.read_text().strip(), False
    key = "cbx_" + secrets.token_urlsafe(24)
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key + "\n")
    return key, True
