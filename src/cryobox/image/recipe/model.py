"""A template recipe: a base and the steps a build VM runs on it, whichever front door it came through.

Every front door reads its request into a :class:`Recipe` (a Dockerfile: :mod:`.dockerfile`; E2B's template steps:
:mod:`.e2bsteps`). The agent executes it in a build VM (:mod:`cryobox.agent.templates.recipebuild`); the host only
moves bytes. ``COPY`` sources travel as *context blobs*: gzip'd tar archives named by the SHA-256 of their bytes
(E2B's ``filesHash``), kept in the object store under :func:`cryobox.objstore.keys.build_context` until the build
is done. A step's cache key is (parent key, the step's canonical JSON, its context hash), so a rebuild that changes
only the last step redoes only that step.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

StepOp = Literal["RUN", "COPY", "ENV", "WORKDIR", "USER"]
"""What a step does. ``ARG`` is resolved while parsing; ``EXPOSE``, ``CMD`` and ``ENTRYPOINT`` are recipe fields."""

BaseKind = Literal["template", "debian", "image", "archive"]


@dataclass(frozen=True)
class Base:
    """Where a recipe starts.

    * ``template``: an existing cryobox template's root filesystem (``ref`` is its name; E2B's ``fromTemplate``,
      and ``e2bdev/base``, E2B's default base image, which stands for cryobox's ``base``).
    * ``debian``: a Debian root filesystem cryobox builds itself from Debian's archive (``ref`` is the suite,
      e.g. ``bookworm``; ``slim`` variants map to the same minbase tree).
    * ``image``: an OCI image (``ref`` is the reference as written: ``registry/name:tag`` or ``name@sha256:…``).
    * ``archive``: an image from an uploaded archive, a ``docker save`` tar or a tar of an OCI image layout (``ref``
      is the SHA-256 of the archive, stored like a context blob; ``name`` picks the image when it holds several:
      one of its ``RepoTags``, or an OCI layout's ``org.opencontainers.image.ref.name``).
    """

    kind: BaseKind
    ref: str
    name: str = ""
    """``archive``: which image of the archive (empty: its only one). Left out of :meth:`Recipe.to_json` when
    empty, so a recipe of any other base reads as it did before there were archives."""


@dataclass(frozen=True)
class Step:
    """One instruction, with its arguments as the build VM's driver reads them.

    * ``RUN``: ``args = (command,)`` run by ``/bin/sh -c`` (shell form) or ``args = ("exec", argv0, argv1, …)``
      (exec form); as the current ``USER`` unless ``user`` is set (E2B's per-step user).
    * ``COPY``: ``args = (src, …, dest)``; sources are paths or globs inside the context blob ``context``;
      ``chown`` (``user[:group]``) and ``mode`` (octal string) optional.
    * ``ENV``: ``args = (key1, value1, key2, value2, …)``, values already expanded.
    * ``WORKDIR``: ``args = (path,)``, absolute (relative paths are resolved against the previous one while parsing).
    * ``USER``: ``args = (user[:group],)``.
    """

    op: StepOp
    args: tuple[str, ...]
    user: str = ""
    env: tuple[str, ...] = ()
    """RUN: extra ``KEY=value`` pairs for this step only (a Dockerfile's ``ARG`` values in scope)."""
    context: str = ""
    """COPY: SHA-256 (hex) of the gzip'd tar holding this step's sources."""
    chown: str = ""
    mode: str = ""
    force: bool = False
    """Do not reuse a cached result for this step (and so for every step after it)."""
    line: int = 0
    """Where the step came from (Dockerfile line, or 1-based E2B step index) for error messages."""

    def cache_json(self) -> str:
        """What identifies the step's effect (``force`` and ``line`` excluded)."""
        body = {
            "op": self.op,
            "args": list(self.args),
            "user": self.user,
            "env": list(self.env),
            "context": self.context,
            "chown": self.chown,
            "mode": self.mode,
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Recipe:
    base: Base
    steps: tuple[Step, ...] = ()
    start_cmd: str = ""
    """Started during the build, after the last step, as the final ``USER`` in the final ``WORKDIR`` with the final
    ``ENV``; the template is baked once ``ready_cmd`` succeeds, so every sandbox has it running."""
    ready_cmd: str = ""
    """A shell command that exits 0 once the start command is ready (default: a short settle delay)."""
    expose: tuple[int, ...] = ()
    force: bool = False
    """Rebuild every step (``--no-cache``)."""
    labels: dict[str, str] = field(default_factory=dict)
    """A Dockerfile's ``LABEL``s, recorded with the template."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.base.name:
            del data["base"]["name"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recipe:
        base = Base(**data["base"])
        steps = tuple(
            Step(**{**s, "args": tuple(s.get("args", ())), "env": tuple(s.get("env", ()))})
            for s in data.get("steps", ())
        )
        return cls(
            base=base,
            steps=steps,
            start_cmd=str(data.get("start_cmd", "")),
            ready_cmd=str(data.get("ready_cmd", "")),
            expose=tuple(int(p) for p in data.get("expose", ())),
            force=bool(data.get("force", False)),
            labels={str(k): str(v) for k, v in dict(data.get("labels", {})).items()},
        )

    def contexts(self) -> tuple[str, ...]:
        """The context blobs the recipe needs, each once, in step order."""
        seen: dict[str, None] = {}
        for step in self.steps:
            if step.context:
                seen.setdefault(step.context, None)
        return tuple(seen)

    def blobs(self) -> tuple[str, ...]:
        """Every blob the recipe needs from the object store: an ``archive`` base's, then its context blobs."""
        archive = (self.base.ref,) if self.base.kind == "archive" else ()
        return tuple(dict.fromkeys((*archive, *self.contexts())))


@dataclass(frozen=True)
class ImageConfig:
    """What a finished image says about the processes it runs: the defaults of every exec in its sandboxes."""

    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = "root"
    start_cmd: str = ""
    expose: tuple[int, ...] = ()


def step_key(parent: str, step: Step) -> str:
    """The cache key of the image after ``step``, given the key of the image before it."""
    digest = hashlib.sha256()
    digest.update(parent.encode())
    digest.update(b"\0")
    digest.update(step.cache_json().encode())
    return digest.hexdigest()


__all__ = ["Base", "BaseKind", "ImageConfig", "Recipe", "Step", "StepOp", "step_key"]
