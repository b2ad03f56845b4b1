"""The host-side nft table ``inet cryobox_<tag>``: what guests may reach.

Policy, for packets arriving from a slot's host veth (``cb<tag>h*``):

* **input** (to the host itself: API, agent, metrics, SSH, anything): dropped unless it belongs to a connection the
  host opened (``ct state established,related``). A guest can answer the host, never call it.
* **forward** to any ``cb*`` interface (another slot, ours or another agent's): dropped. Guests never see each other.
* **forward** to the deny set ``denied`` (:mod:`.denylist`: private, link-local, loopback, CGNAT, multicast, the
  host's networks, the store and database): dropped, before any grant is looked at.
* **forward**, new connections beyond ``conn_limit`` open ones per slot (``ct count`` in the dynamic set
  ``connlimit``): dropped.
* **forward** anywhere else: accepted only if ``ip saddr . ip daddr`` is in the interval set ``egress``, whose
  elements are ``<slot address> . <allowed cidr>``. Egress is denied by default; the slot netns already SNATs the
  guest to its slot address and refuses spoofed sources, so the source address identifies the slot. One set lookup
  serves every slot, whatever the number of rules.
* **forward** towards ``cb<tag>h*``: only replies (``established,related``); nothing else may route into a slot.
* **postrouting**: slot traffic leaving through a non-``cb*`` interface is masqueraded to the host's address
  (``iifname`` is unknown in postrouting, so "from a slot" is spelled ``ip saddr <plan cidr>``).

The table only *adds* drops: other tables (a host firewall, Docker) still see every packet and may drop more.
Routing guests out needs host ``net.ipv4.ip_forward=1``; :meth:`Firewall.ensure` sets it, and nothing turns it
back off, because other software on the host may depend on it by then. With it on, the forward chain above is
what stops guests from using the host as a router to anywhere.
"""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cryobox.errors import InvalidArgument

from ...netpolicy import parse_cidrs
from .denylist import deny_networks
from .netlink import NetworkSetupError, Runner, run_command
from .slots import LINK_PREFIX, Slot, SlotPlan, link_prefix

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
EGRESS_SET = "egress"
DENY_SET = "denied"
CONN_LIMIT = 512
"""Open connections one slot may have through the host at a time (a guest cannot fill the host's conntrack)."""


def _elem_network(value: Any) -> list[ipaddress.IPv4Network]:
    """One concatenation member as ``nft -j`` prints it: ``"1.2.3.4"``, ``{"prefix": ...}`` or ``{"range": ...}``."""
    if isinstance(value, str):
        return [ipaddress.IPv4Network(value)]
    if isinstance(value, dict) and "prefix" in value:
        return [ipaddress.IPv4Network(f"{value['prefix']['addr']}/{value['prefix']['len']}")]
    if isinstance(value, dict) and "range" in value:
        lo, hi = (ipaddress.IPv4Address(v) for v in value["range"])
        return list(ipaddress.summarize_address_range(lo, hi))
    raise NetworkSetupError(f"unexpected nft set element member {value!r}")


def parse_egress_json(text: str) -> dict[str, list[ipaddress.IPv4Network]]:
    """``nft -j list set`` output -> {slot address: [allowed networks]}."""
    out: dict[str, list[ipaddress.IPv4Network]] = {}
    for obj in json.loads(text).get("nftables", []):
        for elem in obj.get("set", {}).get("elem", []) if isinstance(obj, dict) else []:
            if isinstance(elem, dict) and "elem" in elem:  # elements with timeouts/comments are wrapped
                elem = elem["elem"].get("val", elem["elem"])
            if not (isinstance(elem, dict) and "concat" in elem and len(elem["concat"]) == 2):
                raise NetworkSetupError(f"unexpected nft egress element {elem!r}")
            source, dest = elem["concat"]
            out.setdefault(str(source), []).extend(_elem_network(dest))
    return out


class Firewall:
    """The host table of one agent (one tag). ``ensure``/``remove`` are idempotent; egress edits are atomic.

    ``runner`` runs ``nft`` (inject a fake for unit tests); ``ip_forward`` is the host sysctl file ``ensure`` sets.
    """

    def __init__(
        self,
        plan: SlotPlan,
        *,
        runner: Runner = run_command,
        ip_forward: Path = IP_FORWARD,
        deny: Sequence[ipaddress.IPv4Network] | None = None,
        conn_limit: int = CONN_LIMIT,
    ) -> None:
        self.plan = plan
        self.deny = list(deny) if deny is not None else deny_networks()
        self.conn_limit = conn_limit
        self.table = f"cryobox_{plan.tag}"
        self._runner = runner
        self._ip_forward = ip_forward
        self._lock = threading.Lock()  # serializes read-modify-write of the egress set

    def _nft(self, script: str) -> None:
        self._runner(["nft", "-f", "-"], script)

    def ruleset(self, *, fresh: bool = False, egress: Mapping[Slot, Sequence[str]] | None = None) -> str:
        """The nft script ``ensure`` loads (as one transaction: rules are never half-loaded).

        Declaring the set and the base chains is a no-op when they exist; the chains are then flushed and refilled,
        so re-running it refreshes the rules but keeps the egress set's elements. ``fresh`` drops the whole table
        first, in the same transaction, so stale egress from a crashed agent cannot leak into reused slots;
        ``egress`` puts back, in that same transaction, the grants of slots whose VMs were adopted.
        """
        grants = ""
        for slot, cidrs in (egress or {}).items():
            self._check_slot(slot)
            nets = list(ipaddress.collapse_addresses(parse_cidrs(cidrs)))
            if nets:
                grants += f"add element inet {self.table} {EGRESS_SET} {{ {self._elements(slot, nets)} }}\n"
        t, slots, cidr = self.table, f"{link_prefix(self.plan.tag)}*", self.plan.cidr
        head = f"add table inet {t}\ndelete table inet {t}\n" if fresh else ""
        denied = ", ".join(str(n) for n in self.deny)
        deny_elements = f"add element inet {t} {DENY_SET} {{ {denied} }}\n" if denied else ""
        return f"""\
{head}table inet {t} {{
  set {EGRESS_SET} {{ type ipv4_addr . ipv4_addr; flags interval; }}
  set {DENY_SET} {{ type ipv4_addr; flags interval; }}
  set connlimit {{ type ipv4_addr; flags dynamic; size 65535; }}
  chain input {{ type filter hook input priority filter; policy accept; }}
  chain forward {{ type filter hook forward priority filter; policy accept; }}
  chain postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}
}}
flush chain inet {t} input
flush chain inet {t} forward
flush chain inet {t} postrouting
flush set inet {t} {DENY_SET}
{deny_elements}table inet {t} {{
  chain input {{
    iifname "{slots}" ct state established,related accept
    iifname "{slots}" drop
  }}
  chain forward {{
    iifname "{slots}" oifname "{LINK_PREFIX}*" drop
    iifname "{slots}" ip daddr @{DENY_SET} drop
    iifname "{slots}" ct state new add @connlimit {{ ip saddr ct count over {self.conn_limit} }} drop
    iifname "{slots}" ip saddr . ip daddr @{EGRESS_SET} accept
    iifname "{slots}" drop
    oifname "{slots}" ct state established,related accept
    oifname "{slots}" drop
  }}
  chain postrouting {{
    ip saddr {cidr} oifname != "{LINK_PREFIX}*" masquerade
  }}
}}
{grants}"""

    def ensure(self, *, fresh: bool = False, egress: Mapping[Slot, Sequence[str]] | None = None) -> None:
        """Create or refresh the table and turn on host IPv4 forwarding (egress is routed, see module docs)."""
        with self._lock:
            self._nft(self.ruleset(fresh=fresh, egress=egress))
            if self._ip_forward.read_text().strip() != "1":
                self._ip_forward.write_text("1\n")

    def remove(self) -> None:
        """Delete the table (and so every egress grant); a missing table is fine."""
        with self._lock:
            self._nft(f"add table inet {self.table}\ndelete table inet {self.table}\n")

    def exists(self) -> bool:
        lines = self._runner(["nft", "list", "tables", "inet"], None).splitlines()
        return f"table inet {self.table}" in (line.strip() for line in lines)

    def egress(self, slot: Slot) -> list[str]:
        """The destinations ``slot`` may reach, as read back from the kernel."""
        return [str(n) for n in self._egress(slot)]

    def _egress(self, slot: Slot) -> list[ipaddress.IPv4Network]:
        text = self._runner(["nft", "-j", "list", "set", "inet", self.table, EGRESS_SET], None)
        return parse_egress_json(text).get(slot.address, [])

    def _elements(self, slot: Slot, nets: Sequence[ipaddress.IPv4Network]) -> str:
        return ", ".join(f"{slot.address} . {net}" for net in nets)

    def allow_egress(self, slot: Slot, cidrs: list[str]) -> None:
        """Let ``slot`` reach ``cidrs`` (added to what it already has).

        The slot's networks are collapsed with what the kernel holds and rewritten in one transaction: interval
        sets refuse overlapping elements, so ``10.0.0.0/8`` then ``10.1.0.0/16`` must become one element.
        """
        wanted = parse_cidrs(cidrs)
        if not wanted:
            return
        self._check_slot(slot)
        with self._lock:
            current = self._egress(slot)
            merged = list(ipaddress.collapse_addresses([*current, *wanted]))
            drop = [n for n in current if n not in merged]
            add = [n for n in merged if n not in current]
            script = ""
            if drop:
                script += f"delete element inet {self.table} {EGRESS_SET} {{ {self._elements(slot, drop)} }}\n"
            if add:
                script += f"add element inet {self.table} {EGRESS_SET} {{ {self._elements(slot, add)} }}\n"
            if script:
                self._nft(script)

    def clear_egress(self, slot: Slot) -> None:
        """Remove every egress grant of ``slot`` (back to deny-all). Called before a slot is reused."""
        with self._lock:
            current = self._egress(slot)
            if current:
                self._nft(f"delete element inet {self.table} {EGRESS_SET} {{ {self._elements(slot, current)} }}\n")

    def _check_slot(self, slot: Slot) -> None:
        if slot.tag != self.plan.tag:
            raise InvalidArgument(
                f"slot {slot.netns} does not belong to firewall {self.table}", details={"slot_tag": slot.tag}
            )
