"""What an agent does with its sandboxes when it stops (``--on-stop``)."""

from __future__ import annotations

import enum


class OnStop(enum.Enum):
    KEEP = "keep"
    """Default. QEMUs, their network slots, hot memory and the memory server keep running; the
    next agent on this data dir adopts them. The agent exits within seconds whatever the load."""
    HIBERNATE = "hibernate"
    """Hibernate every sandbox to disk first (takes a capture per sandbox), then stop everything; the next agent
    lists them hibernated and wakes each on its next request."""
    KILL = "kill"
    """Kill every sandbox and remove everything the agent made (records too): nothing of this data dir remains
    running."""
