"""The host-side nft table ``inet cryobox_<tag>``: a second wall around the slots, and the guests' way out.

What a guest may reach is decided inside its slot's namespace (:func:`.netlink.slot_ruleset`, :mod:`.egress`).
This table holds, for packets arriving from a slot's host veth (``cb<tag>h*``), should a slot's own rules ever
be missing or wrong:

* **input** (to the host itself: API, agent, metrics, SSH, anything): dropped unless it belongs to a connection the
  host opened (``ct state established,related``). A guest can answer the host, never call it.
* **forward**: ``proxy`` mode — dropped, whatever the destination (the proxy connects from the host itself).
  ``forward`` mode — only TCP from the slots' own addresses, never to another slot (of any agent) nor into the
  floor (:mod:`.denylist`: private, link-local, the host's networks …), masqueraded behind the host's address.
  Towards a slot only replies pass.

``forward`` mode needs the host to route (``net.ipv4.ip_forward``). Where it was off, the first table that needs it
turns it on, remembers that in ``/run/cryobox/ip_forward.<netns>.was``, and every such table then drops forwarding
between interfaces that are not cryobox's (the host routes nothing it did not before); once the last cryobox table
is gone (:func:`release_forwarding`) it is turned off again.

The table only *adds* drops: other tables (a host firewall, Docker) still see every packet and may drop more.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from .netlink import Runner, run_command
from .slots import LINK_PREFIX, SlotPlan, link_prefix

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
STATE_DIR = Path("/run/cryobox")


def was_file(state_dir: Path) -> Path:
    """Where the routing this network namespace had before cryobox turned it on is kept (``ip_forward`` is per
    namespace, ``/run`` is not: agents in namespaces of their own must not read each other's)."""
    return state_dir / f"ip_forward.{os.stat('/proc/thread-self/ns/net').st_ino}.was"


def live_netns(proc: Path = Path("/proc"), mounts: Path = Path("/run/netns")) -> set[int]:
    """The inodes of the network namespaces something still holds: a process, or a bind mount under ``mounts``."""
    found: set[int] = set()
    for holder in [*proc.glob("[0-9]*/ns/net"), *(mounts.iterdir() if mounts.is_dir() else [])]:
        try:
            found.add(os.stat(holder).st_ino)
        except OSError:  # gone meanwhile
            continue
    return found


def prune_records(state_dir: Path, live: set[int]) -> list[Path]:
    """Remove the routing records of network namespaces that are gone (an agent in a namespace of its own killed
    with it: its ``ip_forward`` went with the namespace, its record would stay forever). Returns what it removed."""
    gone = []
    for record in state_dir.glob("ip_forward.*.was"):
        inode = record.name.split(".")[1]
        if inode.isdigit() and int(inode) not in live:
            record.unlink(missing_ok=True)
            gone.append(record)
    return gone


def _tables(runner: Runner) -> list[str]:
    lines = runner(["nft", "list", "tables", "inet"], None).splitlines()
    return [line.strip().removeprefix("table inet ") for line in lines if line.strip().startswith("table inet ")]


def release_forwarding(
    *, runner: Runner = run_command, state_dir: Path = STATE_DIR, ip_forward: Path = IP_FORWARD
) -> bool:
    """Turn ``ip_forward`` back off if a cryobox table turned it on and no cryobox table is left; idempotent.
    Returns whether it did. Records of namespaces that are gone are removed on the way."""
    prune_records(state_dir, live_netns())
    was = was_file(state_dir)
    if not was.exists() or any(t.startswith("cryobox_") for t in _tables(runner)):
        return False
    ip_forward.write_text(was.read_text().strip() or "0")
    was.unlink(missing_ok=True)
    return True


def remove_table(
    tag: str, *, runner: Runner = run_command, state_dir: Path = STATE_DIR, ip_forward: Path = IP_FORWARD
) -> None:
    """Delete the host table of ``tag`` (a missing one is fine); the last cryobox table gone, routing is as it
    was (:func:`release_forwarding`). What a stop does, for what a dead agent left: a table deleted any other way
    leaves the host routing."""
    table = f"cryobox_{tag}"
    runner(["nft", "-f", "-"], f"add table inet {table}\ndelete table inet {table}\n")
    release_forwarding(runner=runner, state_dir=state_dir, ip_forward=ip_forward)


class Firewall:
    """The host table of one agent (one tag). ``ensure``/``remove`` are idempotent; ``runner`` runs ``nft``
    (inject a fake for unit tests)."""

    def __init__(
        self,
        plan: SlotPlan,
        *,
        floor: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network] = (),
        runner: Runner = run_command,
        state_dir: Path = STATE_DIR,
        ip_forward: Path = IP_FORWARD,
    ) -> None:
        self.plan = plan
        self.table = f"cryobox_{plan.tag}"
        self.floor = [net for net in floor if isinstance(net, ipaddress.IPv4Network)]
        self._runner = runner
        self._state_dir = state_dir
        self._ip_forward = ip_forward
        self._lock = threading.Lock()

    def _nft(self, script: str) -> None:
        self._runner(["nft", "-f", "-"], script)

    def ruleset(self, *, fresh: bool = False, routed_before: bool = True) -> str:
        """The nft script ``ensure`` loads, as one transaction; ``fresh`` drops an older table (of any earlier
        version of these rules) first, in the same transaction; ``routed_before``: whether the host forwarded
        before cryobox turned it on (if not, forwarding not involving cryobox's interfaces is dropped)."""
        t, slots, ours = self.table, f"{link_prefix(self.plan.tag)}*", f"{LINK_PREFIX}*"
        head = f"add table inet {t}\ndelete table inet {t}\n" if fresh else ""
        if self.plan.egress == "forward":
            floor = ", ".join(str(net) for net in ipaddress.collapse_addresses(self.floor))
            out = (f'iifname "{slots}" ip daddr {{ {floor} }} drop\n    ' if floor else "") + (
                f'iifname "{slots}" ip saddr {self.plan.cidr} meta l4proto tcp accept\n    '
            )
            others = "" if routed_before else f'iifname != "{ours}" oifname != "{ours}" drop\n    '
            nat = f"""
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {self.plan.cidr} oifname != "{ours}" masquerade
  }}"""
        else:
            out, others, nat = "", "", ""
        return f"""\
{head}table inet {t} {{
  chain input {{ type filter hook input priority filter; policy accept; }}
  chain forward {{ type filter hook forward priority filter; policy accept; }}
}}
flush table inet {t}
table inet {t} {{
  chain input {{
    iifname "{slots}" ct state established,related accept
    iifname "{slots}" drop
  }}
  chain forward {{
    iifname "{slots}" oifname "{ours}" drop
    {out}iifname "{slots}" drop
    oifname "{slots}" ct state established,related accept
    oifname "{slots}" drop
    {others}}}{nat}
}}
"""

    def ensure(self, *, fresh: bool = False) -> None:
        """Create or refresh the table (and, in ``forward`` mode, let the host route)."""
        with self._lock:
            routed_before = self._route() if self.plan.egress == "forward" else True
            self._nft(self.ruleset(fresh=fresh, routed_before=routed_before))

    def _route(self) -> bool:
        """Turn ``ip_forward`` on; returns whether the host routed before cryobox turned it on."""
        prune_records(self._state_dir, live_netns())
        was = was_file(self._state_dir)
        if was.exists():
            return was.read_text().strip() == "1"
        if self._ip_forward.read_text().strip() == "1":
            return True
        self._state_dir.mkdir(parents=True, exist_ok=True)
        was.write_text("0\n")
        self._ip_forward.write_text("1")
        return False

    def remove(self) -> None:
        """Delete the table (a missing table is fine); the last cryobox table gone, routing is as it was."""
        with self._lock:
            remove_table(self.plan.tag, runner=self._runner, state_dir=self._state_dir, ip_forward=self._ip_forward)

    def exists(self) -> bool:
        return self.table in _tables(self._runner)


__all__ = ["LINK_PREFIX", "Firewall", "live_netns", "prune_records", "release_forwarding", "remove_table", "was_file"]
