"""Templates, snapshots and hibernations in the object store: publish from this host, import onto it."""
