"""API keys: ``cbx_<urlsafe random>`` plaintexts, stored only as a lookup prefix plus a SHA-256 hash.

Generated keys carry 32 random bytes, so a fast hash is enough: there is nothing to brute-force that a slow KDF
would protect. The plaintext is shown once, at creation, and never stored.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_SCHEME = "cbx_"
PREFIX_LEN = 12
"""Characters of the plaintext kept in clear (indexed) to find the candidate rows of a presented key."""
RANDOM_BYTES = 32


def generate_key() -> str:
    return KEY_SCHEME + secrets.token_urlsafe(RANDOM_BYTES)


def key_prefix(plaintext: str) -> str:
    return plaintext[:PREFIX_LEN]


def hash_key(plaintext: str) -> str:
    """Hex SHA-256 of the full plaintext."""
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def verify_key(plaintext: str, stored_hash: str) -> bool:
    """Constant-time comparison of ``plaintext``'s hash with a stored one."""
    return hmac.compare_digest(hash_key(plaintext).encode("utf-8"), stored_hash.encode("utf-8"))
