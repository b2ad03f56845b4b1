"""``cryobox bench density --plot``: a self-contained SVG of a density result, written by hand (matplotlib is a
development dependency only, and two small line charts do not need it).

Left: create-to-first-exec latency (p50, p95, p99) per concurrency level. Right: Pss per idle sandbox against the
number of idle sandboxes N.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 900, 380
PANEL_W, PANEL_H = 340, 240
SERIES = (("p50", "#1f77b4"), ("p95", "#ff7f0e"), ("p99", "#d62728"))
PSS_COLOUR = "#2ca02c"
HOST_COLOUR = "#7f7f7f"


@dataclass(frozen=True)
class Panel:
    """A plot area at (``left``, ``top``) mapping data ranges onto its ``PANEL_W`` x ``PANEL_H`` pixels."""

    left: float
    top: float
    x_max: float
    y_max: float

    def x(self, value: float) -> float:
        return round(self.left + value / self.x_max * PANEL_W, 1)

    def y(self, value: float) -> float:
        return round(self.top + PANEL_H - value / self.y_max * PANEL_H, 1)


def nice_max(value: float) -> float:
    """The smallest 1, 2, 4, 5 or 8 times a power of ten at or above ``value`` (an axis' top, whose quarters are
    round too); 1 for nothing."""
    if value <= 0:
        return 1.0
    step = 1.0
    while step * 10 <= value:
        step *= 10
    while step > value:
        step /= 10
    for factor in (1, 2, 4, 5, 8, 10):
        if step * factor >= value:
            return step * factor
    return step * 10  # pragma: no cover - the loop above always returns


def _text(x: float, y: float, content: str, anchor: str = "middle", size: int = 11, weight: str = "normal") -> str:
    return (
        f'<text x="{x}" y="{y}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}">'
        f"{escape(content)}</text>"
    )


def _polyline(points: Sequence[tuple[float, float]], colour: str, dashed: bool = False) -> list[str]:
    path = " ".join(f"{x},{y}" for x, y in points)
    dash = ' stroke-dasharray="5,3"' if dashed else ""
    out = [f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>']
    out += [f'<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>' for x, y in points]
    return out


def _axes(panel: Panel, title: str, x_label: str, y_label: str, x_ticks: Sequence[float]) -> list[str]:
    left, top, bottom = panel.left, panel.top, panel.top + PANEL_H
    out = [
        f'<rect x="{left}" y="{top}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#333"/>',
        _text(left + PANEL_W / 2, top - 12, title, size=13, weight="bold"),
        _text(left + PANEL_W / 2, bottom + 34, x_label),
        f'<text x="{left - 48}" y="{top + PANEL_H / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 {left - 48} {top + PANEL_H / 2})">{escape(y_label)}</text>',
    ]
    for tick in x_ticks:
        out.append(_text(panel.x(tick), bottom + 16, f"{tick:g}"))
    for i in range(5):
        value = panel.y_max * i / 4
        y = panel.y(value)
        out.append(f'<line x1="{left}" y1="{y}" x2="{left + PANEL_W}" y2="{y}" stroke="#ddd"/>')
        out.append(_text(left - 6, y + 4, f"{value:g}", anchor="end"))
    return out


def _legend(left: float, top: float, entries: Sequence[tuple[str, str]]) -> list[str]:
    out = []
    for i, (label, colour) in enumerate(entries):
        y = top + i * 16
        out.append(f'<rect x="{left}" y="{y - 9}" width="12" height="4" fill="{colour}"/>')
        out.append(_text(left + 18, y - 3, label, anchor="start", size=10))
    return out


def latency_panel(levels: Mapping[str, Mapping[str, Any]], left: float, top: float) -> list[str]:
    """p50/p95/p99 create-to-first-exec (ms) against concurrency."""
    rows = [(float(c), s) for c, s in levels.items() if s.get("p50") is not None]
    x_max = max((c for c, _ in rows), default=1.0) * 1.08  # ticks are the levels measured: no round top needed
    y_max = nice_max(max((float(s["p99"]) for _, s in rows), default=0.0) * 1.05)
    panel = Panel(left, top, x_max, y_max)
    out = _axes(panel, "create → first exec", "concurrent creates", "ms", [c for c, _ in rows])
    for key, colour in SERIES:
        out += _polyline([(panel.x(c), panel.y(float(s[key]))) for c, s in rows], colour)
    return out + _legend(left + 10, top + 18, [(key, colour) for key, colour in SERIES])


def pss_panel(levels: Sequence[Mapping[str, Any]], left: float, top: float) -> list[str]:
    """Pss per idle sandbox (and MemAvailable's fall per sandbox, dashed) against N."""
    rows = [(float(level["n"]), level) for level in levels]
    x_max = max((n for n, _ in rows), default=1.0) * 1.08
    tallest = max(
        (max(float(lv["pss_per_sandbox_mib"]), float(lv["host_used_per_sandbox_mib"])) for _, lv in rows), default=0.0
    )
    panel = Panel(left, top, x_max, nice_max(tallest * 1.1))
    out = _axes(panel, "memory per idle sandbox", "idle sandboxes (N)", "MiB", [n for n, _ in rows])
    out += _polyline([(panel.x(n), panel.y(float(lv["pss_per_sandbox_mib"]))) for n, lv in rows], PSS_COLOUR)
    out += _polyline(
        [(panel.x(n), panel.y(float(lv["host_used_per_sandbox_mib"]))) for n, lv in rows], HOST_COLOUR, dashed=True
    )
    legend = [("Pss (QEMU + memory server)", PSS_COLOUR), ("host MemAvailable fall", HOST_COLOUR)]
    return out + _legend(left + 10, top + 18, legend)


def render(result: Mapping[str, Any]) -> str:
    """The SVG document of ``result`` (a ``cryobox bench density`` JSON)."""
    m = result["machine"]
    caption = (
        f"cryobox {m.get('server_version', '')} · {result['template']} · {str(m['accelerator']).upper()} · "
        f"{m['cores']} cores · {m['memory_mib'] / 1024:.0f} GiB · {m['cpu_model']} · {result['measured_at']}"
    )
    body = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        *latency_panel(result["create_to_first_exec_ms"], 80, 50),
        *pss_panel(result["pss"]["levels"], 530, 50),
        _text(WIDTH / 2, HEIGHT - 12, caption, size=10),
        "</svg>",
    ]
    return "\n".join(body) + "\n"
