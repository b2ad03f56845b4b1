"""Small shared helpers (process running, hashing, atomic files)."""
