"""What an operator allows custom template builds: which packages they may add, how many may run at once.

Allowlist: ``CRYOBOX_TEMPLATE_PACKAGES`` and ``CRYOBOX_TEMPLATE_PIP`` hold comma-separated shell patterns
(``python3-*``, ``jq``); unset means anything the archive or PyPI has, an empty value means nothing. A pip
requirement is matched by its project name (``requests`` of ``requests[socks]==2.32.3``). Checked by the
control plane before a build is accepted (403 ``forbidden``) and again by the agent before it downloads.

Limits: ``CRYOBOX_BUILD_CONCURRENCY`` build VMs at once per host (default 1) and ``CRYOBOX_BUILD_QUEUE``
builds waiting for one (default 4); a control plane sends one agent at most their sum of builds at a time.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import Forbidden
from .specs import TemplateSpec

PACKAGES_ENV = "CRYOBOX_TEMPLATE_PACKAGES"
PIP_ENV = "CRYOBOX_TEMPLATE_PIP"
CONCURRENCY_ENV = "CRYOBOX_BUILD_CONCURRENCY"
QUEUE_ENV = "CRYOBOX_BUILD_QUEUE"
_PROJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _patterns(raw: str | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    return tuple(p.strip().lower() for p in raw.split(",") if p.strip())


def project_of(requirement: str) -> str:
    """The normalized project name of a pip requirement (PEP 503: lower case, runs of ``-_.`` as ``-``)."""
    match = _PROJECT.match(requirement)
    return _normalize(match.group(0) if match else requirement)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class BuildAllowlist:
    packages: tuple[str, ...] | None = None
    """Patterns of Debian packages a template may add; ``None``: any."""
    pip: tuple[str, ...] | None = None
    """Patterns of pip projects a template may add; ``None``: any."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BuildAllowlist:
        source = os.environ if env is None else env
        pip = _patterns(source.get(PIP_ENV))
        return cls(_patterns(source.get(PACKAGES_ENV)), None if pip is None else tuple(map(_normalize, pip)))

    def check(self, spec: TemplateSpec) -> None:
        """:raises Forbidden: ``spec`` adds a package or pip project outside the allowlist (all are named)."""
        refused = [p for p in spec.added_packages if not _allowed(p, self.packages)]
        refused_pip = [r for r in spec.added_pip if not _allowed(project_of(r), self.pip)]
        if refused or refused_pip:
            names = ", ".join([*refused, *refused_pip])
            raise Forbidden(
                f"this host's operator does not allow {names} in templates",
                details={"packages": refused, "pip": refused_pip},
            )


def _allowed(name: str, patterns: tuple[str, ...] | None) -> bool:
    return patterns is None or any(fnmatch.fnmatchcase(name, p) for p in patterns)


@dataclass(frozen=True)
class BuildLimits:
    concurrency: int = 1
    """Build VMs at once on one host."""
    depth: int = 4
    """Builds waiting for a build VM on one host."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BuildLimits:
        source = os.environ if env is None else env
        return cls(int(source.get(CONCURRENCY_ENV, "1")), int(source.get(QUEUE_ENV, "4")))

    @property
    def per_agent(self) -> int:
        """Builds one control plane has in flight on one agent at most (running and waiting)."""
        return self.concurrency + self.depth
