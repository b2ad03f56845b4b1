"""The host-side nft table ``inet cryobox_<tag>``: a second wall around the slots.

Guests never route through the host: every TCP connection a guest opens is redirected, inside its slot's
namespace, to the egress proxy (:mod:`.egress`), which connects from the host itself after judging it, and the
slot forwards nothing else out (:func:`.netlink.slot_ruleset`). This table holds, for packets arriving from a
slot's host veth (``cb<tag>h*``), should a slot's own rules ever be missing or wrong:

* **input** (to the host itself: API, agent, metrics, SSH, anything): dropped unless it belongs to a connection the
  host opened (``ct state established,related``). A guest can answer the host, never call it.
* **forward**: dropped, whatever the destination (another slot, the host's networks, the internet); towards a
  slot only replies pass.

The table only *adds* drops: other tables (a host firewall, Docker) still see every packet and may drop more.
"""

from __future__ import annotations

import threading

from .netlink import Runner, run_command
from .slots import LINK_PREFIX, SlotPlan, link_prefix


class Firewall:
    """The host table of one agent (one tag). ``ensure``/``remove`` are idempotent; ``runner`` runs ``nft``
    (inject a fake for unit tests)."""

    def __init__(self, plan: SlotPlan, *, runner: Runner = run_command) -> None:
        self.plan = plan
        self.table = f"cryobox_{plan.tag}"
        self._runner = runner
        self._lock = threading.Lock()

    def _nft(self, script: str) -> None:
        self._runner(["nft", "-f", "-"], script)

    def ruleset(self, *, fresh: bool = False) -> str:
        """The nft script ``ensure`` loads, as one transaction; ``fresh`` drops an older table (of any earlier
        version of these rules) first, in the same transaction."""
        t, slots = self.table, f"{link_prefix(self.plan.tag)}*"
        head = f"add table inet {t}\ndelete table inet {t}\n" if fresh else ""
        return f"""\
{head}table inet {t} {{
  chain input {{ type filter hook input priority filter; policy accept; }}
  chain forward {{ type filter hook forward priority filter; policy accept; }}
}}
flush chain inet {t} input
flush chain inet {t} forward
table inet {t} {{
  chain input {{
    iifname "{slots}" ct state established,related accept
    iifname "{slots}" drop
  }}
  chain forward {{
    iifname "{slots}" drop
    oifname "{slots}" ct state established,related accept
    oifname "{slots}" drop
  }}
}}
"""

    def ensure(self, *, fresh: bool = False) -> None:
        """Create or refresh the table."""
        with self._lock:
            self._nft(self.ruleset(fresh=fresh))

    def remove(self) -> None:
        """Delete the table; a missing table is fine."""
        with self._lock:
            self._nft(f"add table inet {self.table}\ndelete table inet {self.table}\n")

    def exists(self) -> bool:
        lines = self._runner(["nft", "list", "tables", "inet"], None).splitlines()
        return f"table inet {self.table}" in (line.strip() for line in lines)


__all__ = ["LINK_PREFIX", "Firewall"]
