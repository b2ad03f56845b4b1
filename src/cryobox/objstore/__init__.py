"""The object store, used by both sides: the client, store keys, chunked images, manifests and pins, leases and
GC."""
