"""E2B compatibility: the E2B control-plane API under ``/e2b`` and the sandbox side (envd over Connect RPC, its
REST file routes and any guest port) under ``/e2b/sandbox``, both translated onto the same control plane and agent
interface as ``/v1``."""
