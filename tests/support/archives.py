"""The package archives a build VM's ``apt-get`` may reach, as an operator of such a site opts them in.

On these machines Debian's archive resolves to an address inside a range the egress floor blocks; a test that
runs a Dockerfile's ``apt-get`` opts exactly those addresses in (``CRYOBOX_EGRESS_ALLOW_PRIVATE``), resolved when
the test runs from the mirror the images are built from — never written down."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from cryobox.image.rootfs import mirror


def _addresses(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, 80, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({str(info[4][0]) for info in infos})


def archive_names() -> dict[str, list[str]]:
    """Name -> IPv4 addresses now, for the package archives a build VM's ``apt-get`` and ``pip`` use: the Debian
    mirror the images are built from and pip's default index and file hosts (read from pip itself). The suite's
    own name server answers these (and only these) beyond its stand-in internet, so builds resolve them while no
    test query leaves the machine."""
    from pip._internal.models.index import PyPI  # the index pip in a build VM uses by default

    hosts = [urlsplit(mirror()).hostname, PyPI.netloc, PyPI.file_storage_domain]
    found = {host: _addresses(host) for host in hosts if host}
    return {host: addresses for host, addresses in found.items() if addresses}


def archive_networks() -> list[str]:
    """``<address>/32`` for every IPv4 address the Debian mirror's host name resolves to now."""
    host = urlsplit(mirror()).hostname
    if not host:
        return []
    try:
        infos = socket.getaddrinfo(host, 80, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({f"{info[4][0]}/32" for info in infos})
