"""A sandbox's network policy, the same value on both sides of the seam: the control plane validates and stores
it (``server/``), a host agent enforces it (``agent/net/egress``). What a tenant may ask for, independent of how a
host enforces it."""

from .cidrs import parse_cidrs
from .decide import Verdict, decide, name_resolves
from .model import EgressPolicy, legacy_policy
from .names import matches_name, normalize_name

__all__ = [
    "EgressPolicy",
    "Verdict",
    "decide",
    "legacy_policy",
    "matches_name",
    "name_resolves",
    "normalize_name",
    "parse_cidrs",
]
