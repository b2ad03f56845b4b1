"""Template specs: what a template's image holds and how it is warmed up before its snapshot is taken."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DEBIAN_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "iproute2", "procps")


@dataclass(frozen=True)
class TemplateSpec:
    """Inputs of a template. Its generation is a hash of these plus the image and machine inputs."""

    name: str
    packages: tuple[str, ...] = BASE_PACKAGES
    memory_mib: int = 512
    cpus: int = 1
    warmup: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    pip: tuple[str, ...] = ()  # installed into the image with pip at build time (python3-pip is added)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if not data["pip"]:
            del data["pip"]  # keeps the generations of specs that predate the field
        return data


BASE = TemplateSpec(
    name="base",
    memory_mib=512,
    cpus=1,
    warmup=("true", "python3 -c 'import json, subprocess, os'"),
)

CODE_INTERPRETER = TemplateSpec(
    name="code-interpreter",
    packages=BASE_PACKAGES + ("python3-numpy", "python3-pandas", "python3-matplotlib"),
    memory_mib=1024,
    cpus=1,
    warmup=(
        "true",
        "MPLBACKEND=Agg python3 -c 'import numpy, pandas, matplotlib, matplotlib.pyplot as plt; "
        'plt.plot([1, 2]); plt.savefig("/tmp/warm.png")\' && rm -f /tmp/warm.png',
    ),
)

DEFAULT_TEMPLATES: tuple[TemplateSpec, ...] = (BASE, CODE_INTERPRETER)


def derived_spec(
    name: str,
    base: TemplateSpec,
    *,
    packages: tuple[str, ...] = (),
    pip: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
    warmup: tuple[str, ...] = (),
    cpus: int | None = None,
    memory_mib: int | None = None,
) -> TemplateSpec:
    """A custom template: a built-in's package set plus extra Debian and pip packages, files and warm-up."""
    extra = tuple(p for p in packages if p not in base.packages)
    if pip and "python3-pip" not in base.packages + extra:
        extra += ("python3-pip",)
    return TemplateSpec(
        name=name,
        packages=base.packages + extra,
        memory_mib=memory_mib or base.memory_mib,
        cpus=cpus or base.cpus,
        warmup=base.warmup + warmup,
        files={**base.files, **(files or {})},
        pip=base.pip + pip,
    )


def by_name(name: str) -> TemplateSpec | None:
    return next((spec for spec in DEFAULT_TEMPLATES if spec.name == name), None)
