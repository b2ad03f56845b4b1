"""Python SDK over the public HTTP API."""
