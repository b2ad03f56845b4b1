"""The ``cryobox`` command line.

A ``cryobox serve`` handed its socket by a supervisor (``LISTEN_PID`` naming it) may be a restart that finds a warm
standby serving already, a standby spawned to import in the background, or an upgrade's successor: its ~2 s of
imports run at a lower priority (:data:`IMPORT_NICENESS` added), so that the process serving, or taking over, is
not starved of the host's cores meanwhile; ``serve`` restores the priority before it starts its work.
"""

import os as _os
import sys as _sys

IMPORT_NICENESS = 0
"""What this process's niceness was raised by while it imported (0: not raised)."""

if _sys.argv[1:2] == ["serve"] and _os.environ.get("LISTEN_PID") == str(_os.getpid()):
    try:
        _os.setpriority(_os.PRIO_PROCESS, 0, _os.getpriority(_os.PRIO_PROCESS, 0) + 10)
        IMPORT_NICENESS = 10
    except OSError:
        pass
