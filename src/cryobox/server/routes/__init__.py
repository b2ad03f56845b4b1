"""The public HTTP API (``/v1``): routes, request dependencies, wire models and the error boundary."""
