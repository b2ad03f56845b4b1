"""``--templates a,b``: which built-in templates a host serves."""

from __future__ import annotations

import typer

from ..image.specs import BUILTIN_TEMPLATES, DEFAULT_TEMPLATES, TemplateSpec


def parse_templates(raw: str | None) -> tuple[TemplateSpec, ...]:
    if not raw:
        return DEFAULT_TEMPLATES
    wanted = [t.strip() for t in raw.split(",") if t.strip()]
    known = {spec.name: spec for spec in BUILTIN_TEMPLATES}
    unknown = [t for t in wanted if t not in known]
    if unknown or not wanted:
        raise typer.BadParameter(f"--templates: unknown {unknown} (built-in: {', '.join(known)})")
    return tuple(known[t] for t in wanted)
