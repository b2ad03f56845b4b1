"""What a finished recipe's image says about its processes: the base image's defaults, then each step's."""

from __future__ import annotations

import dataclasses
import posixpath

from .model import ImageConfig, Recipe, Step

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclasses.dataclass(frozen=True)
class StepState:
    """The environment, directory and user a step runs with (what the ``ENV``, ``WORKDIR`` and ``USER`` before
    it said). ``user_set``/``workdir_set``: whether the recipe or its base named them (else the front door's
    default applies to the finished template's execs)."""

    env: dict[str, str]
    workdir: str
    user: str
    user_set: bool = False
    workdir_set: bool = False

    def to_json(self) -> dict[str, object]:
        return {"env": dict(self.env), "workdir": self.workdir, "user": self.user}

    def after(self, step: Step) -> StepState:
        if step.op == "ENV":
            pairs = dict(zip(step.args[0::2], step.args[1::2], strict=True))
            return dataclasses.replace(self, env={**self.env, **pairs})
        if step.op == "WORKDIR":
            return dataclasses.replace(
                self, workdir=posixpath.normpath(posixpath.join(self.workdir, step.args[0])), workdir_set=True
            )
        if step.op == "USER":
            return dataclasses.replace(self, user=step.args[0], user_set=True)
        return self


def initial_state(base: ImageConfig | None) -> StepState:
    """The state before the first step: an OCI image's config, or a Debian/template base's (root in ``/``)."""
    if base is None:
        return StepState(env={"PATH": DEFAULT_PATH}, workdir="/", user="root")
    env = {"PATH": DEFAULT_PATH, **base.env}
    return StepState(
        env=env,
        workdir=base.workdir or "/",
        user=base.user or "root",
        user_set=bool(base.user),
        workdir_set=base.workdir not in ("", "/"),
    )


def states(recipe: Recipe, base: ImageConfig | None) -> list[StepState]:
    """``states[i]`` is what step ``i`` runs with; ``states[-1]`` (one more than the steps) is the final one."""
    out = [initial_state(base)]
    for step in recipe.steps:
        out.append(out[-1].after(step))
    return out


def final_config(recipe: Recipe, base: ImageConfig | None) -> ImageConfig:
    """The finished image's defaults: a start command of the recipe's own replaces the base image's."""
    last = states(recipe, base)[-1]
    start = recipe.start_cmd or (base.start_cmd if base is not None else "")
    expose = tuple(sorted({*recipe.expose, *(base.expose if base is not None else ())}))
    return ImageConfig(
        env=last.env,
        workdir=last.workdir if last.workdir_set else "",
        user=last.user if last.user_set else "",
        start_cmd=start,
        expose=expose,
    )


__all__ = ["DEFAULT_PATH", "StepState", "final_config", "initial_state", "states"]
