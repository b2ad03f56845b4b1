"""Guest memory images on the host: hot copies on tmpfs, and the memory server that pages them from the object
store."""
