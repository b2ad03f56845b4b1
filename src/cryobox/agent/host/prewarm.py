"""What a start computes from the host alone, computed ahead (a warm standby does it while it waits, so a takeover
does not: each is a subprocess or a file parse, 50-100 ms of a restart's start on a busy host)."""

from __future__ import annotations

from ...util.tls import default_tls_context
from ..vm import host_tsc_khz, qemu


def prewarm() -> None:
    """The QEMU version, the host's TSC rate and the default TLS context, cached for this process."""
    qemu.version_line()
    host_tsc_khz()
    default_tls_context()
