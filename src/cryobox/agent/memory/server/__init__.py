"""The memory server process: a FUSE file per memory image whose reads are chunks from the cache or the store."""
