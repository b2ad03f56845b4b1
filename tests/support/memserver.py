"""What a running memory server reports on its control socket (``/stats``), for the lazy-memory and the
cross-host integration tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from cryobox.config import Paths


def memstats(data_dir: Path, cache_dir: Path) -> dict[str, Any]:
    sock = Paths(data_dir, cache_dir).memserver_dir / "control.sock"
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://memserver") as http:
        response = http.get("/stats")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result


def base_image(stats: dict[str, Any]) -> dict[str, Any]:
    (name,) = [n for n in stats["images"] if n.startswith("templates+base+")]
    image: dict[str, Any] = stats["images"][name]
    return image
