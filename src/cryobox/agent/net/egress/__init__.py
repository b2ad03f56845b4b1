"""The host-side egress proxy of the guests' network policy."""
