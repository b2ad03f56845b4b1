"""E2B's template steps read into a :class:`~cryobox.image.recipe.model.Recipe` (:func:`recipe_from_e2b`).

The input is the body the ``e2b`` SDK (2.x) sends to ``POST /v2/templates/{templateID}/builds/{buildID}``
(``TemplateBuildStartV2``): ``fromImage`` | ``fromTemplate``, ``fromImageRegistry``, ``force``, ``steps``,
``startCmd``, ``readyCmd``. Each step is ``{type, args, force, filesHash?, forceUpload?}`` with the SDK's layouts:

* ``RUN``: ``[command]`` or ``[command, user]`` (``pip_install``, ``apt_install`` run as ``root`` this way);
* ``COPY``: ``[src, dest, user, mode]`` (``user`` and ``mode`` may be ``""``; ``mode`` is 4-digit octal) plus
  ``filesHash``, E2B's hash of the files the SDK uploaded. ``Step.context`` is that ``filesHash`` *as given*: the
  control plane replaces it with the SHA-256 of the stored context blob before the build starts;
* ``ENV``: ``[key1, value1, key2, value2, …]``; ``WORKDIR``: ``[path]`` (a relative path is resolved against the
  previous ``WORKDIR`` of the body, ``/`` before any); ``USER``: ``[user]``.

``Step.line`` is the step's 1-based index in ``steps``: the ``reason.step`` E2B's build status names (``"base"``
and ``"finalize"`` are the steps before and after them). A step's ``force`` is ``Step.force``, the body's ``force``
is ``Recipe.force``; ``forceUpload``, ``resolveSymlinks`` and ``gzip`` only concern the client's upload. Private
registries (``fromImageRegistry``), unknown fields and unknown step types are refused, never dropped.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from cryobox.errors import InvalidArgument
from cryobox.image.recipe.bases import base_of
from cryobox.image.recipe.dockerignore import go_clean
from cryobox.image.recipe.model import Base, Recipe, Step, StepOp

_FIELDS = frozenset({"fromImage", "fromTemplate", "fromImageRegistry", "force", "steps", "startCmd", "readyCmd"})
_STEP_FIELDS = frozenset({"type", "args", "force", "filesHash", "forceUpload", "resolveSymlinks", "gzip"})
_FILES_HASH = re.compile(r"^[0-9a-f]{64}$")
_MODE = re.compile(r"^[0-7]{3,4}$")
_ARITY: Mapping[str, tuple[int, int]] = MappingProxyType(
    {"RUN": (1, 2), "COPY": (2, 4), "WORKDIR": (1, 1), "USER": (1, 1)}
)


def _refuse(message: str, field: str, step: int = 0) -> InvalidArgument:
    details: dict[str, Any] = {"field": field}
    if step:
        details["step"] = step
        message = f"steps[{step - 1}] (step {step}): {message}"
    return InvalidArgument(message, details=details)


def _text(value: Any, field: str, step: int = 0) -> str:
    if not isinstance(value, str):
        raise _refuse(f"{field} must be a string", field, step)
    return value


def _base(template: Mapping[str, Any]) -> Base:
    if template.get("fromImageRegistry") is not None:
        raise _refuse("fromImageRegistry: private registry credentials are not supported", "fromImageRegistry")
    image, name = template.get("fromImage"), template.get("fromTemplate")
    if bool(image) == bool(name):
        raise _refuse("exactly one of fromImage or fromTemplate must be given and non-empty", "fromImage")
    if name:
        return Base("template", _text(name, "fromTemplate"))
    return base_of(_text(image, "fromImage"))


def _args(raw: Mapping[str, Any], op: str, index: int) -> list[str]:
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise _refuse("args must be a list of strings", "args", index)
    low, high = _ARITY.get(op, (2, 1 << 16))
    if not low <= len(args) <= high or (op == "ENV" and len(args) % 2):
        shape = "key/value pairs" if op == "ENV" else f"{low} to {high} arguments"
        raise _refuse(f"{op} takes {shape}, not {len(args)}", "args", index)
    return [str(a) for a in args]


def _copy(args: list[str], raw: Mapping[str, Any], index: int, force: bool) -> Step:
    src, dest, user, mode = (*args, "", "")[:4]
    cleaned = go_clean(src)
    if src.startswith("/") or cleaned == ".." or cleaned.startswith("../"):
        raise _refuse(f"COPY source {src!r} must stay inside the uploaded files", "args", index)
    if mode and not _MODE.match(mode):
        raise _refuse(f"COPY mode {mode!r} is not an octal mode such as 0755", "args", index)
    files_hash = raw.get("filesHash")
    if not isinstance(files_hash, str) or not _FILES_HASH.match(files_hash):
        raise _refuse("COPY needs filesHash, a lowercase hex SHA-256", "filesHash", index)
    return Step("COPY", (src, dest), context=files_hash, chown=user, mode=mode, force=force, line=index)


def _step(raw: Any, index: int, workdir: str) -> Step:
    if not isinstance(raw, Mapping):
        raise _refuse("a step must be an object", "steps", index)
    for name in raw:
        if name not in _STEP_FIELDS:
            raise _refuse(f"unknown step field {name!r}", str(name), index)
    op = raw.get("type")
    if op not in ("RUN", "COPY", "ENV", "WORKDIR", "USER"):
        raise _refuse(f"unknown step type {op!r}", "type", index)
    force = raw.get("force") or False
    if not isinstance(force, bool):
        raise _refuse("force must be a boolean", "force", index)
    args = _args(raw, op, index)
    if op != "COPY" and raw.get("filesHash") is not None:
        raise _refuse(f"filesHash is only for COPY steps, not {op}", "filesHash", index)
    kind: StepOp = op
    if op == "COPY":
        return _copy(args, raw, index, force)
    if op == "RUN":
        if not args[0].strip():
            raise _refuse("RUN needs a command", "args", index)
        return Step(kind, (args[0],), user=args[1] if len(args) > 1 else "", force=force, line=index)
    if op == "WORKDIR":
        path = posixpath.normpath(posixpath.join(workdir, args[0])) if args[0] else ""
        args = ["/" + path.lstrip("/")] if path else []
    blank = not all(args[::2]) if op == "ENV" else not all(args)
    if blank:
        raise _refuse(f"{op} arguments can not be blank", "args", index)
    return Step(kind, tuple(args), force=force, line=index)


def recipe_from_e2b(template: Mapping[str, Any]) -> Recipe:
    """The recipe an E2B ``TemplateBuildStartV2`` body describes; :class:`InvalidArgument` (``details.field``,
    and ``details.step``, the 1-based index, for a step) for anything it cannot build."""
    for name in template:
        if name not in _FIELDS:
            raise _refuse(f"unknown field {name!r}", str(name))
    base = _base(template)
    raw_steps = template.get("steps") or []
    if not isinstance(raw_steps, list):
        raise _refuse("steps must be a list", "steps")
    steps: list[Step] = []
    workdir = "/"
    for index, raw in enumerate(raw_steps, start=1):
        step = _step(raw, index, workdir)
        if step.op == "WORKDIR":
            workdir = step.args[0]
        steps.append(step)
    force = template.get("force") or False
    if not isinstance(force, bool):
        raise _refuse("force must be a boolean", "force")
    return Recipe(
        base=base,
        steps=tuple(steps),
        start_cmd=_text(template.get("startCmd") or "", "startCmd"),
        ready_cmd=_text(template.get("readyCmd") or "", "readyCmd"),
        force=force,
    )


def files_hashes(template: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``filesHash`` of each ``COPY`` step, each once, in step order: the uploads the build needs (the body is
    validated as :func:`recipe_from_e2b` does)."""
    return recipe_from_e2b(template).contexts()


__all__ = ["files_hashes", "recipe_from_e2b"]
