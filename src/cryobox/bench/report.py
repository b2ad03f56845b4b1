"""Where every benchmark writes its JSON: ``<out_dir>/<name>-<UTC timestamp>.json``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def write_result(out_dir: Path, name: str, result: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out
