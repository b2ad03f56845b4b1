"""Host agent: everything on one host (QEMU processes, templates, sandboxes, reclaim)."""
