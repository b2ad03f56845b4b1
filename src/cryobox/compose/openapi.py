"""The public API's OpenAPI document as ``cryobox serve`` serves it (``GET /openapi.json``), built in this process
over a throwaway SQLite registry with no agents and no VMs: what ``sdk-ts``'s ``npm run gen`` turns into
TypeScript types (``sdk-ts/src/schema.ts``) and what the drift test compares them against.

``python -m cryobox.compose.openapi [OUT]`` writes it (sorted keys, two-space indent) to ``OUT`` or stdout.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..registry import Registry
from ..server.access.ratelimit import RateLimitConfig, RateLimiter
from ..server.control.fleet import FleetConfig
from ..server.control.snapshots import RetentionPolicy
from ..server.metrics import Metrics
from .app import create_app
from .parts import build_control


def document() -> dict[str, Any]:
    """The served OpenAPI document (the app is built, never started: no lifespan, no network)."""
    with tempfile.TemporaryDirectory(prefix="cryobox-openapi-") as tmp:
        registry = Registry(f"sqlite:///{Path(tmp) / 'registry.db'}")
        try:
            registry.migrate()
            control = build_control(
                registry, FleetConfig(deadline_s=10.0, node_token="-"), RetentionPolicy(), None, Metrics()
            )
            app = create_app(control, limiter=RateLimiter.from_config(RateLimitConfig.from_env({})), host="-")
            return app.openapi()
        finally:
            registry.close()


def render(doc: dict[str, Any]) -> str:
    """The document as a stable text (sorted keys), so that regenerating it changes nothing when the API did not."""
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render(document())
    if argv:
        Path(argv[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
