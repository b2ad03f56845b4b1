"""The package archives a build VM's ``apt-get`` may reach, as an operator of such a site opts them in.

On these machines Debian's archive resolves to an address inside a range the egress floor blocks; a test that
runs a Dockerfile's ``apt-get`` opts exactly those addresses in (``CRYOBOX_EGRESS_ALLOW_PRIVATE``), resolved when
the test runs from the mirror the images are built from — never written down."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from cryobox.image.rootfs import mirror


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
