"""Which registries a host speaks to and how: mirrors, plain-HTTP registries, credentials, timeouts.

Environment (read by :meth:`RegistrySettings.from_env`):

* ``CRYOBOX_REGISTRY_MIRROR``: comma-separated ``registry=url`` pairs, e.g.
  ``docker.io=http://127.0.0.1:5000,ghcr.io=https://ghcr-mirror.internal``. A pull from ``registry`` goes to
  ``url`` instead (``url`` + ``/v2/…``; its scheme is the operator's choice, so a mirror may be plain HTTP). There is
  no fallback to the registry itself when the mirror fails.
* ``CRYOBOX_REGISTRY_INSECURE``: comma-separated ``host`` or ``host:port`` entries spoken to over plain HTTP
  (``host`` alone: any port). Loopback (``localhost``, ``127.0.0.0/8``, ``[::1]``) always is; everything else is
  HTTPS with certificate verification.
* ``CRYOBOX_REGISTRY_AUTH_FILE``: a Docker ``config.json`` whose ``auths`` give ``user:password`` per registry
  (``{"auths": {"ghcr.io": {"auth": base64("user:pass")}}}``, or ``username``/``password``); credential helpers are
  not run.
* ``CRYOBOX_REGISTRY_TIMEOUT_S``: seconds a registry may stay silent (connect, and between bytes); default 30.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from ...errors import InvalidArgument
from .reference import DOCKER_HUB, Reference

DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class RegistrySettings:
    mirrors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Registry (as a reference names it) -> base URL to pull from instead."""
    insecure: frozenset[str] = frozenset()
    """``host`` or ``host:port`` spoken to over plain HTTP, besides loopback."""
    credentials: Mapping[str, tuple[str, str]] = field(default_factory=lambda: MappingProxyType({}))
    """Registry -> ``(user, password)`` for its token service or its ``Basic`` challenge."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    cache_dir: Path | None = None
    """Where pulled layers are kept by digest (a second pull of them downloads nothing); None: no cache."""
    platform: str = "linux/amd64"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, cache_dir: Path | None = None) -> RegistrySettings:
        env = os.environ if environ is None else environ
        auth_file = env.get("CRYOBOX_REGISTRY_AUTH_FILE", "").strip()
        raw_timeout = env.get("CRYOBOX_REGISTRY_TIMEOUT_S", "").strip()
        try:
            timeout = float(raw_timeout) if raw_timeout else DEFAULT_TIMEOUT_S
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise InvalidArgument(f"CRYOBOX_REGISTRY_TIMEOUT_S must be a positive number, not {raw_timeout!r}")
        return cls(
            mirrors=parse_mirrors(env.get("CRYOBOX_REGISTRY_MIRROR", "")),
            insecure=parse_insecure(env.get("CRYOBOX_REGISTRY_INSECURE", "")),
            credentials=read_auth_file(Path(auth_file)) if auth_file else MappingProxyType({}),
            timeout_s=timeout,
            cache_dir=cache_dir,
        )

    def base_url(self, ref: Reference) -> str:
        """Where ``ref``'s registry API answers: its mirror, or ``http(s)://`` its API host."""
        mirror = self.mirrors.get(ref.registry)
        if mirror:
            return mirror
        host = ref.api_host
        return f"{'http' if self.plain_http(host) else 'https'}://{host}"

    def plain_http(self, host_port: str) -> bool:
        host = _host_of(host_port)
        return is_loopback(host) or host_port in self.insecure or host in self.insecure


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_mirrors(text: str) -> Mapping[str, str]:
    mirrors: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        registry, sep, url = item.partition("=")
        registry, url = registry.strip(), url.strip().rstrip("/")
        if not sep or not registry or not url.startswith(("http://", "https://")):
            raise InvalidArgument(f"CRYOBOX_REGISTRY_MIRROR: {item!r} is not registry=http(s)://host[:port][/path]")
        mirrors[DOCKER_HUB if registry in ("index.docker.io", "registry-1.docker.io") else registry] = url
    return MappingProxyType(mirrors)


def parse_insecure(text: str) -> frozenset[str]:
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def read_auth_file(path: Path) -> Mapping[str, tuple[str, str]]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(f"CRYOBOX_REGISTRY_AUTH_FILE {path}: cannot read it: {exc}") from exc
    auths = doc.get("auths") if isinstance(doc, dict) else None
    creds: dict[str, tuple[str, str]] = {}
    for registry, entry in (auths or {}).items():
        if not isinstance(entry, dict):
            continue
        name = str(registry).removeprefix("https://").removeprefix("http://").split("/")[0]
        name = DOCKER_HUB if name in ("index.docker.io", "registry-1.docker.io") else name
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(str(entry["auth"])).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError) as exc:
                raise InvalidArgument(f"CRYOBOX_REGISTRY_AUTH_FILE: the auth of {registry} is not base64") from exc
            creds[name] = (user, password)
        elif entry.get("username"):
            creds[name] = (str(entry["username"]), str(entry.get("password", "")))
    return MappingProxyType(creds)


def _host_of(host_port: str) -> str:
    if host_port.startswith("["):
        return host_port.split("]")[0] + "]"
    return host_port.rsplit(":", 1)[0] if host_port.count(":") == 1 else host_port


__all__ = ["RegistrySettings", "is_loopback", "parse_insecure", "parse_mirrors", "read_auth_file"]
