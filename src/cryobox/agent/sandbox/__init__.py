"""Sandboxes on one host: the service that owns them, the VM factory and warm pools, admission, fork and restore
fidelity."""
