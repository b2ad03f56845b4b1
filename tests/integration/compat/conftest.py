"""Fixtures the compatibility suites share: a server set up as E2B itself is (sandbox hosts under a domain, over
HTTPS), for the Python and the JavaScript SDKs' host tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cryobox.agent.templates.bake import Template
from cryobox.bench.server import ServeProcess, free_port
from tests.support.sandbox_domain import DOMAIN, Hosted, wildcard_certificate


@pytest.fixture(scope="module")
def hosted(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, templates: dict[str, Template]
) -> Iterator[Hosted]:
    """A server of its own (one per test module): the sandbox domain ``cbx.test``, the test CA's wildcard
    certificate, HTTPS on a free port (no warm pool: each create restores)."""
    authority, cert, key = wildcard_certificate(DOMAIN, tmp_path_factory.mktemp("hosts-tls"))
    https_port = free_port()
    args = ["--sandbox-domain", DOMAIN, "--tls-cert", str(cert), "--tls-key", str(key)]
    args += ["--https-port", str(https_port), "--templates", "base"]
    data_dir = tmp_path_factory.mktemp("hosts")
    internet = {"CRYOBOX_E2B_INTERNET": "deny"}  # the guests reach nothing: no stand-in internet here
    with ServeProcess(data_dir, cache_dir=cache_dir, prespawn=0, extra_args=args, extra_env=internet) as serve:
        yield Hosted(serve, https_port, authority)
