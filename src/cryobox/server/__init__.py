"""Control plane: the public HTTP API (``/v1``) over the host agent."""
