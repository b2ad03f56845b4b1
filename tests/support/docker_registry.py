"""A container registry on the suite's stand-in internet, for tests of Docker inside sandboxes: Debian's
``docker-registry`` serves HTTPS on this host's loopback (a certificate of the internet's test CA for its name), and
a relay listening on an address of the internet's namespace (port 443) reaches it; the internet's DNS answers the
name with that address. A sandbox's ``docker pull <name>/<image>`` therefore resolves and connects the way it would
out there, through cryobox's egress proxy and policy; nothing leaves the machine. Images are pushed to it with
``skopeo`` from OCI layouts (:class:`tests.support.oci.LayoutWriter`)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.internet import Internet
from tests.support.loopfwd import Relays
from tests.support.oci import Files, LayoutWriter
from tests.support.oci_registry import OciRegistry, run_registry


@dataclass(frozen=True)
class InternetRegistry:
    name: str
    """The registry's host name, as image references use it (``<name>/hello:1``)."""
    address: str
    """Where the internet's DNS sends ``name`` (port 443)."""
    local: OciRegistry
    """The registry itself, on loopback (tests push here)."""
    ca_pem: bytes
    """The CA its certificate chains to: a guest's Docker trusts it at ``/etc/docker/certs.d/<name>/ca.crt``."""

    def push(self, work: Path, repository: str, layers: list[Files], **config: Any) -> str:
        """Write an image of ``layers`` (and image ``config`` such as ``Cmd``) and push it as ``repository:1``;
        returns its reference as a guest pulls it."""
        layout = work / f"layout-{repository.replace('/', '-')}"
        writer = LayoutWriter(layout)
        writer.tag("1", writer.image(layers, **config))
        cmd = ["skopeo", "--insecure-policy", "copy", "--dest-tls-verify=false", "--quiet"]
        cmd += [f"oci:{layout}:1", f"docker://{self.local.host}/{repository}:1"]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            pytest.fail(f"skopeo copy failed ({result.returncode}): {result.stderr[-2000:]}")
        return f"{self.name}/{repository}:1"


@contextlib.contextmanager
def registry_on(internet: Internet, name: str = "registry.example.test") -> Iterator[InternetRegistry]:
    """A registry answering as ``https://<name>`` on ``internet`` until the block ends (also on failure)."""
    cert, key = internet.authority.issue([name])
    with run_registry(tls=(cert, key)) as local:
        address = internet.add_address()
        relays = Relays()
        try:
            host, port = local.host.rsplit(":", 1)
            relays.add(internet.netns, (address, 443), (host, int(port)))
            internet.add_name(name, ipv4=[address])
            yield InternetRegistry(name=name, address=address, local=local, ca_pem=internet.ca_pem)
        finally:
            internet.remove_name(name)
            relays.close()
