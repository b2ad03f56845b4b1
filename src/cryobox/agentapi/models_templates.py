"""Templates on the wire: what an agent serves (:class:`TemplateInfo`) and a custom build: :class:`TemplateBuild`
carries the template's inputs as :class:`BuildSpec` (the fields of :class:`~cryobox.image.specs.TemplateSpec`),
:class:`BuildEvent` its progress.

Re-exported by :mod:`.models`. The control plane reads the public request (``POST /v1/templates``,
:class:`cryobox.models.TemplateCreateRequest`) into the spec with :func:`spec_from_request`; the agent builds
what the spec says and never sees the public request. Before specs were typed, a build carried that request
instead (``{"request": {...}}``), so during a rolling upgrade the control plane still sends it beside the spec
(an agent of the previous version reads only it), and an agent still accepts a build that carries only it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .. import models as public
from ..errors import InvalidArgument
from ..image.specs import BASE_PACKAGES, TemplateSpec, by_name, derived_spec


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


def spec_from_request(request: public.TemplateCreateRequest) -> TemplateSpec:
    """The template a public build request asks for: its base's spec plus what the request adds."""
    base = by_name(request.base)
    if base is None:  # pragma: no cover - the request model only admits built-in names
        raise InvalidArgument(f"unknown base template {request.base!r}")
    return derived_spec(
        request.name,
        base,
        packages=tuple(request.packages),
        pip=tuple(request.pip),
        files=dict(request.files),
        warmup=tuple(request.warmup),
        cpus=request.cpu,
        memory_mib=request.memory_mb,
    )


class TemplateInfo(_Model):
    name: str
    generation: str
    cpus: int
    memory_mib: int
    created_at: float
    path: str = ""


class BuildSpec(_Model):
    """A template's inputs, field for field :class:`~cryobox.image.specs.TemplateSpec` (same defaults)."""

    name: str
    packages: tuple[str, ...] = BASE_PACKAGES
    memory_mib: int = 512
    cpus: int = 1
    warmup: tuple[str, ...] = ()
    files: dict[str, str] = Field(default_factory=dict)
    pip: tuple[str, ...] = ()
    base: str = ""
    recipe: dict[str, Any] | None = None
    """A recipe build (:class:`cryobox.image.recipe.model.Recipe` as JSON); its context blobs are in the object
    store (:func:`cryobox.objstore.keys.build_context`) before the build is sent."""
    agent_disk: bool = False
    """Boot from the agent disk (:mod:`cryobox.image.agentdisk`): the image needs no userland of its own."""
    kernel_modules: bool = False
    """The kernel's module tree in the image (the built-in ``docker``)."""
    disk_free_mib: int = 0
    """Free space in the root filesystem beyond the default."""

    @classmethod
    def of(cls, spec: TemplateSpec) -> BuildSpec:
        return cls.model_validate(dataclasses.asdict(spec))

    def template_spec(self) -> TemplateSpec:
        return TemplateSpec(**self.model_dump())


class TemplateBuild(_Model):
    """Build and bake the custom template ``spec`` on an agent."""

    spec: BuildSpec
    request: dict[str, Any] | None = None
    """The public request ``spec`` was read from, for agents of the previous version (they read only this);
    an agent reads ``spec``. To be dropped once no such agent runs."""

    @classmethod
    def of_request(cls, raw: dict[str, Any]) -> TemplateBuild:
        """The build of a public request's JSON (as the registry keeps it); ``InvalidArgument`` if it is not one."""
        try:
            request = public.TemplateCreateRequest.model_validate(raw)
        except ValueError as err:  # pydantic's ValidationError included
            raise InvalidArgument(f"not a template request: {err}") from err
        return cls(spec=BuildSpec.of(spec_from_request(request)), request=dict(raw))

    @model_validator(mode="before")
    @classmethod
    def _from_request(cls, data: Any) -> Any:
        """A build from a control plane of the previous version carries only the public request: read it here."""
        if isinstance(data, dict) and "spec" not in data and isinstance(data.get("request"), dict):
            request = public.TemplateCreateRequest.model_validate(data["request"])
            return {**data, "spec": BuildSpec.of(spec_from_request(request))}
        return data


class BuildEvent(_Model):
    """A template build's progress line, or its end (``template`` on success, ``error`` on failure).

    A recipe build also streams its steps' output: ``log`` lines, each with the ``step`` it belongs to (E2B's
    ``reason.step``: ``"base"``, the 1-based step index as a string, or ``"finalize"``) and a ``level``
    (``info``/``error``). A failure's ``error`` names the step in ``step``.
    """

    progress: str = ""
    template: TemplateInfo | None = None
    error: str | None = None
    log: str | None = None
    step: str | None = None
    level: str = "info"


__all__ = ["BuildEvent", "BuildSpec", "TemplateBuild", "TemplateInfo", "spec_from_request"]
