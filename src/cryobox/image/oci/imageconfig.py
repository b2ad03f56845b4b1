"""An image's config blob read into what cryobox keeps of it: an :class:`ImageConfig`, the platform, the diff IDs.

``start_cmd`` is the image's ``Entrypoint`` followed by its ``Cmd`` (Docker's rule: with an entrypoint, the command
is its arguments; without one, the command runs alone), as one shell-quoted line (:func:`shlex.join`). A shell-form
``CMD`` is already ``["/bin/sh", "-c", "…"]`` in the config, so it round-trips.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from ...errors import ImagePullFailed
from ..recipe.model import ImageConfig
from .reference import is_digest


@dataclass(frozen=True)
class ImageFacts:
    config: ImageConfig
    platform: str
    """``os/architecture[/variant]`` as the config states it."""
    diff_ids: list[str]
    """The ``sha256:`` of each layer unpacked, in order (``rootfs.diff_ids``)."""


def read_image_config(data: bytes) -> ImageFacts:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImagePullFailed(f"the image config is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ImagePullFailed("the image config is not a JSON object")
    run = doc.get("config") or {}
    if not isinstance(run, dict):
        raise ImagePullFailed("the image config's 'config' is not an object")
    parts = [str(doc.get("os") or ""), str(doc.get("architecture") or "")]
    if doc.get("variant"):
        parts.append(str(doc["variant"]))
    rootfs = doc.get("rootfs") or {}
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list) or not all(isinstance(d, str) and is_digest(d) for d in diff_ids):
        raise ImagePullFailed("the image config has no valid rootfs.diff_ids (sha256 digests)")
    config = ImageConfig(
        env=_env(run.get("Env")),
        workdir=str(run.get("WorkingDir") or "/"),
        user=str(run.get("User") or "root"),
        start_cmd=shlex.join(_strings(run.get("Entrypoint")) + _strings(run.get("Cmd"))),
        expose=_ports(run.get("ExposedPorts")),
    )
    return ImageFacts(config=config, platform="/".join(parts), diff_ids=list(diff_ids))


def _strings(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):  # never written by Docker, but some tools do
        return ["/bin/sh", "-c", value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ImagePullFailed(f"the image config's Entrypoint/Cmd is not a list of strings: {value!r}")


def _env(value: Any) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in value or []:
        key, sep, val = str(item).partition("=")
        if key:
            env[key] = val if sep else ""
    return env


def _ports(value: Any) -> tuple[int, ...]:
    ports: set[int] = set()
    for key in value or {}:
        number = str(key).split("/")[0]
        if number.isdigit() and 0 < int(number) < 65536:
            ports.add(int(number))
    return tuple(sorted(ports))


__all__ = ["ImageFacts", "read_image_config"]
