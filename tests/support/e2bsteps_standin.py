"""A minimal stand-in for :func:`cryobox.image.recipe.e2bsteps.recipe_from_e2b` (written on another branch) so the
E2B template routes can be tested before it lands: ``install(monkeypatch)`` makes the module importable. It reads
only what the tests' templates use (``fromImage``/``fromTemplate``, RUN/COPY/ENV/WORKDIR/USER, start and ready)."""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from typing import Any

import pytest

from cryobox.image.recipe.model import Base, Recipe, Step

MODULE = "cryobox.image.recipe.e2bsteps"


def recipe_from_e2b(body: Mapping[str, Any]) -> Recipe:
    image = str(body.get("fromImage") or "")
    base = (
        Base("template", str(body["fromTemplate"]))
        if body.get("fromTemplate")
        else Base("debian", image.split(":")[-1])
    )
    steps = []
    for index, raw in enumerate(body.get("steps") or (), start=1):
        args = [str(a) for a in raw.get("args") or ()]
        op = str(raw["type"])
        if op == "COPY":
            steps.append(
                Step("COPY", (args[0], args[1]), chown=args[2], mode=args[3], context=str(raw["filesHash"]), line=index)
            )
        elif op == "RUN":
            steps.append(Step("RUN", (args[0],), user=args[1] if len(args) > 1 else "", line=index))
        else:
            steps.append(Step(op, tuple(args), line=index))  # type: ignore[arg-type]
    return Recipe(
        base, tuple(steps), start_cmd=str(body.get("startCmd") or ""), ready_cmd=str(body.get("readyCmd") or "")
    )


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``cryobox.image.recipe.e2bsteps`` this stand-in, unless the real one is there."""
    try:
        __import__(MODULE)
    except ImportError:
        module = types.ModuleType(MODULE)
        module.recipe_from_e2b = recipe_from_e2b  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, MODULE, module)
