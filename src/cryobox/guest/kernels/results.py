"""A kernel's output → E2B's code-interpreter output lines (``type`` ``stdout`` | ``stderr`` | ``result`` |
``error`` | ``number_of_executions``), one JSON object per line.

A result carries the MIME bundle IPython's display machinery produced for the object: ``text/plain`` → ``text``,
``text/html`` → ``html`` (a DataFrame), ``image/png`` → ``png`` (base64, a matplotlib figure), ``image/svg+xml`` →
``svg``, ``image/jpeg``, ``application/pdf``, ``text/markdown``, ``text/latex``, ``application/json``,
``application/javascript``; anything else under ``extra``. ``is_main_result`` marks the cell's value
(``execute_result``), as opposed to ``display()`` calls and shown figures (``display_data``).
"""

from __future__ import annotations

import re
import time
from typing import Any

MIME_KEYS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def now() -> str:
    stamp = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp * 1e6) % 1_000_000:06d}Z"


def result_line(data: dict[str, Any], *, main: bool) -> dict[str, Any]:
    line: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra: dict[str, Any] = {}
    for mime, value in data.items():
        key = MIME_KEYS.get(mime)
        if key is None:
            extra[mime] = value
        elif key == "json":
            line[key] = value
        else:
            line[key] = value if isinstance(value, str) else "".join(value) if isinstance(value, list) else str(value)
    if extra:
        line["extra"] = extra
    return line


def stream_line(name: str, text: str) -> dict[str, Any]:
    return {"type": "stderr" if name == "stderr" else "stdout", "text": text, "timestamp": now()}


def error_line(name: str, value: str, traceback: list[str]) -> dict[str, Any]:
    """The traceback without terminal colours (IPython colours it for a terminal)."""
    return {"type": "error", "name": name, "value": value, "traceback": "\n".join(ANSI.sub("", t) for t in traceback)}
