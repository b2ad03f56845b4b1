"""Templates: built-in and custom images baked into a running snapshot (bake, build VM, quiesce, localize)."""
