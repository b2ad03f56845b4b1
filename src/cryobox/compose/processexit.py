"""How a server process ends once everything it owns is stopped and closed."""

from __future__ import annotations

import logging
import os
import sys


def exit_now() -> None:
    """Exit 0 skipping the interpreter's finalization: freeing every module and object took 0.5 s here, which a
    restart waited for (systemd starts the next process when this one exits). Only after a clean stop."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
