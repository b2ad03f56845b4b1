"""Wire models of template builds from a Dockerfile or an image reference (``POST /v1/templates/build`` and the
build routes), shared by the server, cryobox's SDK and what PandaStack's SDK reads.

A *build* is not a template: its ``status`` is ``queued`` → ``building`` → ``done`` | ``failed`` (PandaStack's
vocabulary, which its SDK's ``wait_for_build`` waits for), while the template it makes keeps
``building`` | ``ready`` | ``error`` on ``GET /v1/templates/{name}``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

BuildStatus = Literal["queued", "building", "done", "failed"]
BuildLevel = Literal["debug", "info", "warn", "error"]


class FailedStep(BaseModel):
    """Where a failed build stopped: ``step`` is ``base`` (the ``FROM``), ``1``.. (the recipe's steps in order) or
    ``finalize`` (the start and ready commands, the bake); ``line`` and ``instruction`` name the Dockerfile line."""

    step: str
    line: int | None = None
    instruction: str | None = None


class TemplateBuild(BaseModel):
    id: str
    name: str
    """The template the build makes."""
    status: BuildStatus
    error: str | None = None
    failed_step: FailedStep | None = None
    started_at: str | None = None
    ended_at: str | None = None
    cpu: int
    memory_mb: int
    image_ref: str | None = None
    """The image reference of an image build (``FROM`` of a Dockerfile build is in the recipe, not here)."""
    steps_total: int = 0
    """Phases a build goes through: ``base``, each step, ``finalize`` (the denominator of a progress bar)."""
    logs_url: str = ""


class TemplateBuildList(BaseModel):
    items: list[TemplateBuild]


class BuildLogLine(BaseModel):
    offset: int
    timestamp: str
    level: str
    step: str
    message: str


class BuildLogPage(BaseModel):
    """``GET /v1/templates/{name}/builds/{id}/logs``: lines from ``offset``; ``next_offset`` is where the next page
    starts. The build's status is read before the lines, so once it is ``done`` or ``failed`` the page is complete
    (an empty page after it means the end)."""

    build_id: str
    status: BuildStatus
    logs: list[BuildLogLine] = Field(default_factory=list)
    next_offset: int


__all__ = [
    "BuildLevel",
    "BuildLogLine",
    "BuildLogPage",
    "BuildStatus",
    "FailedStep",
    "TemplateBuild",
    "TemplateBuildList",
]
