"""One host's lifetime: start-up, ownership of a data dir, reclaim and adoption after a restart, ``cryobox gc``."""
