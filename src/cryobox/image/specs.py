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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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


def by_name(name: str) -> TemplateSpec | None:
    return next((spec for spec in DEFAULT_TEMPLATES if spec.name == name), None)
