"""The public listener's options shared by ``cryobox serve`` and ``cryobox control``: the sandbox domain
(``{port}-{sandbox_id}.{domain}`` hosts) and the operator's certificate for the HTTPS listener."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import CryoboxError

if TYPE_CHECKING:  # the listeners (uvicorn) and the E2B front door (starlette) load when a server starts
    from ..compose.listeners import TlsListener

DOMAIN_ENV = "CRYOBOX_SANDBOX_DOMAIN"
"""The environment's ``--sandbox-domain`` (:mod:`cryobox.compat.e2b.sandbox_hosts` serves those hosts)."""
SandboxDomain = Annotated[
    str | None,
    typer.Option(
        envvar=DOMAIN_ENV,
        help="serve sandbox ports at {port}-{sandbox_id}.DOMAIN (wildcard DNS *.DOMAIN to this server)",
    ),
]
TlsCert = Annotated[
    Path | None,
    typer.Option(envvar="CRYOBOX_TLS_CERT", help="certificate chain (PEM) for an HTTPS listener, e.g. *.DOMAIN's"),
]
TlsKey = Annotated[Path | None, typer.Option(envvar="CRYOBOX_TLS_KEY", help="the certificate's private key (PEM)")]


def front_door(
    domain: str | None, cert: Path | None, key: Path | None, https_host: str, https_port: int
) -> tuple[str | None, TlsListener | None]:
    """The sandbox domain (normal form) and the HTTPS listener the options ask for, checked before anything
    starts (:raises typer.BadParameter: a bad domain, certificate or key)."""
    from ..compat.e2b.sandbox_hosts import normal_domain
    from ..compose.listeners import tls_listener

    try:
        return (normal_domain(domain) if domain else None), tls_listener(cert, key, https_host, https_port)
    except CryoboxError as err:
        raise typer.BadParameter(err.message) from None
