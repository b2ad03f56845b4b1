"""What a step runs with: the build's ``ENV``, ``WORKDIR`` and ``USER`` so far (the host keeps them and sends them
with every ``step``), and a step as :meth:`cryobox.image.recipe.model.Recipe.to_json` writes it (read here without
importing cryobox: this package runs alone in the build VM)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import BuildError

OPS = ("RUN", "COPY", "ENV", "WORKDIR", "USER")


@dataclass(frozen=True)
class BuildState:
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = "root"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildState:
        env = data.get("env", {})
        if not isinstance(env, dict):
            raise BuildError("state.env must be an object")
        return cls(
            env={str(k): str(v) for k, v in env.items()},
            workdir=str(data.get("workdir") or "/"),
            user=str(data.get("user") or "root"),
        )


@dataclass(frozen=True)
class StepSpec:
    op: str
    args: tuple[str, ...]
    user: str = ""
    env: tuple[str, ...] = ()
    context: str = ""
    chown: str = ""
    mode: str = ""
    line: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepSpec:
        op = str(data.get("op", ""))
        if op not in OPS:
            raise BuildError(f"unknown step op {op!r}")
        return cls(
            op=op,
            args=tuple(str(a) for a in data.get("args", ())),
            user=str(data.get("user", "")),
            env=tuple(str(e) for e in data.get("env", ())),
            context=str(data.get("context", "")),
            chown=str(data.get("chown", "")),
            mode=str(data.get("mode", "")),
            line=int(data.get("line", 0)),
        )

    @property
    def where(self) -> str:
        return f"{self.op} (line {self.line})" if self.line else self.op


__all__ = ["OPS", "BuildState", "StepSpec"]
