"""Build and tear down one slot's namespace, veth pair and tap with netlink (pyroute2), never the ``ip`` command.

Layout of slot ``i`` (addresses from :class:`~cryobox.agent.net.slots.Slot`)::

    host netns                      | netns cryobox-<tag>-<i>
    cb<tag>h<i>  host_ip/30  <-veth->  eth0  address/30, default via host_ip
                                    |  tap0  172.16.0.1/30, MAC 02:cb:00:00:00:01 (QEMU attaches here)
                                    |  nft: daddr address -> dnat 172.16.0.2; saddr 172.16.0.2 -> snat address

How we get into the namespace: a *dedicated, short-lived thread* ``unshare(CLONE_NEWNET)``s itself, bind-mounts
``/proc/thread-self/ns/net`` at ``/run/netns/<name>`` (``pyroute2.netns.attach``), and then does everything that
must happen inside: its netlink socket, the tap ioctl (a tap is created in the netns of the task that opens
``/dev/net/tun``) and the ``net.ipv4.ip_forward`` write (``/proc/sys/net`` resolves to the netns of the task that
opens it). Network namespaces are per *thread* on Linux, so this never disturbs the rest of the process, and
because the thread exits afterwards nothing can reuse a thread left in the wrong namespace (which is why this is
not done on an ``asyncio.to_thread`` pool thread). The veth is created from inside with its peer placed in the
host namespace through an fd opened before the unshare. ``IPRoute(netns=...)`` / ``NetNS`` fork a helper process
for every socket and every tap, which costs more per slot and forks from a process that runs many threads; this
forks nothing (build times: docs/SPECIFICATION.md). The slot's nft table is loaded with
``nsenter --net=/run/netns/<name> nft -f -``.

Everything is named after the slot's tag, so :func:`reclaim` can find and delete a crashed agent's leftovers.

All functions here block: call them on a worker thread (``asyncio.to_thread``). pyroute2's synchronous API drives
its own event loop and raises "This event loop is already running" on a thread that runs one, so
:func:`_not_on_event_loop` turns that into a clear error up front.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import hashlib
import ipaddress
import logging
import os
import socket
import subprocess
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from cryobox.errors import CryoboxError
from cryobox.util.system import in_fresh_thread

from .slots import (
    GATEWAY_IP,
    GATEWAY_MAC,
    GUEST_IP,
    GUEST_PREFIXLEN,
    MARK_ALLOW,
    MARK_DENY,
    MARK_PASS,
    NETNS_DIR,
    PROXY_PORT,
    Slot,
    check_tag,
    link_prefix,
    netns_prefix,
)

log = logging.getLogger(__name__)

# (argv, stdin) -> stdout; raises NetworkSetupError on a non-zero exit. Injected so unit tests need no root.
Runner = Callable[[Sequence[str], "str | None"], str]

CLONE_NEWNET = 0x40000000
NS_TABLE = "cryobox"
# QEMU opens the tap with IFF_TAP | IFF_NO_PI (vnet_hdr=off); match it so the persistent device agrees.
_TAP_FLAGS = {"no_pi": True, "one_queue": False, "vnet_hdr": False, "multi_queue": False}


class NetworkSetupError(CryoboxError):
    """Building, loading rules into, or tearing down a network slot failed (internal error)."""


class Tagged(NamedTuple):
    netns: list[str]
    links: list[str]


class Reclaimed(NamedTuple):
    netns: int
    links: int
    deferred: list[int] = []
    """Slot indices whose leftovers were left for the slot pool (``reclaim(defer=True)``)."""


def run_command(argv: Sequence[str], stdin: str | None = None) -> str:
    """Run a short host command (``nsenter``/``nft``), returning stdout; failures carry stderr in ``details``."""
    try:
        proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkSetupError(f"{argv[0]} could not run: {exc}", details={"argv": list(argv)}) from exc
    if proc.returncode != 0:
        raise NetworkSetupError(
            f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()[-500:]}",
            details={"argv": list(argv), "stderr": proc.stderr[-2000:], "returncode": proc.returncode},
        )
    return proc.stdout


def in_netns(name: str, *argv: str) -> list[str]:
    """argv running ``argv`` inside the named netns (mount, pid, user namespaces untouched)."""
    return ["nsenter", f"--net={NETNS_DIR / name}", *argv]


def slot_ruleset(slot: Slot) -> str:
    """The slot netns' own nft table (loaded whole: re-loading it replaces the previous one atomically).

    * prerouting: the host reaches the guest at ``address``: DNAT it to the one baked ``GUEST_IP`` (from the host's
      end of the veth only: a stray packet of a guest connection whose conntrack entry is gone must not be taken
      for the host calling). In ``proxy``
      mode every TCP connection the guest opens to anything but its gateway is redirected to the egress proxy
      (:mod:`.egress`, on ``GATEWAY_IP:PROXY_PORT`` in this namespace), which judges it by the sandbox's policy
      and, if allowed, makes the connection itself from the host.
    * forward (``forward`` mode): the guest's TCP goes out only as the egress gate decided it. Its packets reach
      this chain after :func:`slot_queue_rules` queued them to the gate, marked with a verdict
      (:mod:`.egress.gate`): a decision's mark is copied to the connection, a deny is sticky and answered with a
      reset, a connection nobody decides (no gate serving the queue) is reset. Nothing else the guest starts is
      routed out (UDP other than DNS, QUIC, ICMP, IPv6 are dropped here); only DNAT'ed traffic from the host and
      replies enter.
    * input: DNS on the gateway address (answered by the egress service's name server, per policy), the proxy
      through the redirect in ``proxy`` mode; nothing else of the namespace itself.
    * output (``forward`` mode): nothing of the namespace's own goes out towards the host (QEMU lives here: were
      a guest to take it over, it would still not reach what the gate did not allow; the host table lets the
      slot addresses' TCP through, so this is the wall).
    """
    if slot.egress == "proxy":
        own = ""
        redirect = f'\n    iifname "{slot.tap}" ip daddr != {GATEWAY_IP} meta l4proto tcp redirect to :{PROXY_PORT}'
        proxy_in = f'\n    iifname "{slot.tap}" meta l4proto tcp th dport {PROXY_PORT} ct status dnat accept'
        forward = f"""
    iifname "{slot.ns_veth}" oifname "{slot.tap}" ip daddr {GUEST_IP} ct status dnat accept
    ct direction reply ct state established,related accept"""
    else:
        redirect, proxy_in = "", ""
        own = f"""
  chain output {{
    type filter hook output priority filter; policy accept;
    oifname "{slot.ns_veth}" drop
  }}"""
        forward = f"""
    ct mark {MARK_ALLOW:#x} accept
    ct status dnat accept
    ct state related accept
    meta mark {MARK_PASS:#x} accept
    meta mark {MARK_DENY:#x} ct mark set {MARK_DENY:#x} reject with tcp reset
    ct mark {MARK_DENY:#x} reject with tcp reset
    meta mark {MARK_ALLOW:#x} ct mark set {MARK_ALLOW:#x} accept
    iifname "{slot.tap}" meta l4proto tcp reject with tcp reset"""
    return f"""\
table inet {NS_TABLE}
delete table inet {NS_TABLE}
table inet {NS_TABLE} {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "{slot.ns_veth}" ip saddr {slot.host_ip} ip daddr {slot.address} dnat ip to {GUEST_IP}{redirect}
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "{slot.ns_veth}" ip saddr {GUEST_IP} snat ip to {slot.address}
  }}
  chain forward {{
    type filter hook forward priority filter + 10; policy drop;{forward}
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname "{slot.tap}" ct state established,related accept{proxy_in}
    iifname "{slot.tap}" ip daddr {GATEWAY_IP} meta l4proto {{ udp, tcp }} th dport 53 accept
    iifname "{slot.tap}" drop
  }}{own}
}}
"""


def slot_queue_rules(slot: Slot) -> str:
    """The slot's ``iptables-nft-restore`` input: in ``forward`` mode, the packets of a guest's connection nothing
    decided yet (both ways), and what the server still sends on a denied one (the gate turns it into a reset for
    the guest), go to NFQUEUE 0, where the egress gate serves them (``--queue-bypass``: with no gate serving, they
    go on unmarked, and :func:`slot_ruleset`'s last rules reset or drop them). xtables' NFQUEUE
    target because nft's own ``queue`` statement needs ``CONFIG_NFT_QUEUE``, which not every kernel has (this
    project's CI hosts do not); it runs at ``filter`` priority, before the nft chain (``filter + 10``) that reads
    its verdicts' marks."""
    to_gate = "-m mark --mark 0 -j NFQUEUE --queue-num 0 --queue-bypass"
    out, back = f"-i {slot.tap} -o {slot.ns_veth} -p tcp", f"-i {slot.ns_veth} -o {slot.tap} -p tcp"
    queue = (
        f"-A FORWARD -m connmark --mark {MARK_ALLOW:#x} -j ACCEPT\n"  # the bulk of the packets: out at once
        f"-A FORWARD {out} -m connmark --mark 0 -m conntrack --ctdir ORIGINAL {to_gate}\n"
        f"-A FORWARD {back} -m connmark --mark 0 -m conntrack --ctdir REPLY {to_gate}\n"
        f"-A FORWARD {back} -m connmark --mark {MARK_DENY:#x} -m conntrack --ctdir REPLY {to_gate}\n"
        if slot.egress == "forward"
        else ""
    )
    return f"*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n{queue}COMMIT\n"


def _load_rules(slot: Slot, runner: Runner) -> None:
    runner(in_netns(slot.netns, "nft", "-f", "-"), slot_ruleset(slot))
    runner(in_netns(slot.netns, "iptables-nft-restore"), slot_queue_rules(slot))


def _not_on_event_loop(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"{what} blocks (netlink): call it via asyncio.to_thread, not on the event loop thread")


def _unshare_net() -> None:
    # os.unshare only exists from Python 3.12; CDLL(None) is the already-loaded libc (find_library would fork ldconfig)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")


def _index(ipr: Any, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise NetworkSetupError(f"interface {ifname} vanished during setup", details={"ifname": ifname})
    return int(found[0])


def _build_in_new_netns(slot: Slot, progress: set[str]) -> None:
    """Runs on a throwaway thread (see the module docstring); records in ``progress`` what it created."""
    host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        with IPRoute() as host:  # bound to the host netns for its whole life
            _unshare_net()
            netns.attach(slot.netns, "thread-self")
            progress.add("netns")
            with IPRoute() as ns:
                ns.link("set", index=_index(ns, "lo"), state="up")
                ns.link("add", ifname=slot.ns_veth, kind="veth", peer={"ifname": slot.host_veth, "net_ns_fd": host_fd})
                progress.add("veth")
                eth = _index(ns, slot.ns_veth)
                ns.addr("add", index=eth, address=slot.address, prefixlen=slot.prefixlen)
                ns.link("set", index=eth, state="up")
                ns.link("add", ifname=slot.tap, kind="tuntap", mode="tap", ifr=_TAP_FLAGS)
                tap = _index(ns, slot.tap)
                ns.link("set", index=tap, address=GATEWAY_MAC, state="up")
                ns.addr("add", index=tap, address=GATEWAY_IP, prefixlen=GUEST_PREFIXLEN)
                ns.route("add", dst="0.0.0.0/0", gateway=slot.host_ip)
                # this thread's netns is the slot's, so this is the slot's ip_forward, not the host's
                with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
                    f.write("1")
            veth = _index(host, slot.host_veth)
            host.addr("add", index=veth, address=slot.host_ip, prefixlen=slot.prefixlen)
            host.link("set", index=veth, state="up")
    finally:
        os.close(host_fd)


def slot_rules_digest(slot: Slot) -> str:
    """What identifies the rules :func:`slot_ruleset` gives ``slot`` today (a VM's record keeps the digest of the
    rules its slot was loaded with: an adopting agent that has the same rules does not load them again)."""
    return hashlib.sha256((slot_ruleset(slot) + slot_queue_rules(slot)).encode()).hexdigest()[:16]


def load_slot_rules(slot: Slot, *, runner: Runner = run_command) -> None:
    """(Re)load the slot's nft table as :func:`slot_ruleset` has it now: an adopted VM's slot, built by an
    agent of an older version, gets today's rules (the table is replaced in one transaction)."""
    _load_rules(slot, runner)


def create_slot(slot: Slot, *, runner: Runner = run_command) -> None:
    """Build ``slot`` from nothing; on failure, undo exactly what this call created, then raise.

    Refuses (without touching them) a netns or host link that already exist under the slot's names: run
    :func:`reclaim` at startup for a crashed agent's leftovers.
    """
    _not_on_event_loop("create_slot")
    progress: set[str] = set()
    try:
        in_fresh_thread(lambda: _build_in_new_netns(slot, progress))
        _load_rules(slot, runner)
    except BaseException as exc:
        try:
            if "veth" in progress:
                with IPRoute() as ipr:
                    _delete_link(ipr, slot.host_veth)
            if "netns" in progress:
                _remove_netns(slot.netns)
        except Exception:
            log.exception("cleaning up half-built slot %s failed", slot.netns)
        if isinstance(exc, CryoboxError) or not isinstance(exc, Exception):
            raise
        raise NetworkSetupError(
            f"building network slot {slot.index} failed: {exc}", details={"slot": slot.index, "netns": slot.netns}
        ) from exc


def _delete_link(ipr: Any, ifname: str) -> bool:
    for index in ipr.link_lookup(ifname=ifname):
        try:
            ipr.link("del", index=index)
        except NetlinkError as exc:
            if exc.code != errno.ENODEV:
                raise
            return False
        return True
    return False


def _remove_netns(name: str) -> bool:
    if not (NETNS_DIR / name).exists():
        return False
    try:
        netns.remove(name)  # lazy umount + unlink; the kernel frees the netns (and the tap) when unused
    except FileNotFoundError:
        return False
    return True


def destroy_slot(slot: Slot) -> None:
    """Delete ``slot``; idempotent. Deleting the host veth end removes both ends synchronously (the netns itself
    is freed asynchronously by the kernel, so we do not rely on it to take the veth away)."""
    _not_on_event_loop("destroy_slot")
    with IPRoute() as ipr:
        _delete_link(ipr, slot.host_veth)
    _remove_netns(slot.netns)


def list_tagged(tag: str) -> Tagged:
    """Names of every netns and host link carrying ``tag`` (whoever created them)."""
    check_tag(tag)
    _not_on_event_loop("list_tagged")
    ns_prefix, l_prefix = netns_prefix(tag), link_prefix(tag)
    names = sorted(n for n in netns.listnetns(str(NETNS_DIR)) if n.startswith(ns_prefix))
    # the C library's link dump, names only: pyroute2 decoded every host link's attributes to read their names
    # (with 50 slots' veths, in a step that took 0.18-0.25 s of a loaded restart's start; the decoding's own share
    # was not measured apart)
    links = sorted(name for _, name in socket.if_nameindex() if name.startswith(l_prefix))
    return Tagged(netns=names, links=links)


def host_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 destination in the host's main routing table (except the default route): what slot CIDRs
    must not overlap."""
    _not_on_event_loop("host_networks")
    found = []
    with IPRoute() as ipr:
        for route in ipr.get_routes(family=socket.AF_INET):
            dst, length = route.get_attr("RTA_DST"), route["dst_len"]
            if dst and length:
                found.append(ipaddress.IPv4Network(f"{dst}/{length}", strict=False))
    return found


def reclaim(tag: str, keep: Iterable[Slot] = (), defer: bool = False) -> Reclaimed:
    """Destroy every netns and host link carrying ``tag`` (a previous agent's leftovers) except the slots in
    ``keep`` (adopted VMs still run in them). Returns what went. ``defer``: leave whole slots (a netns or link
    named as slot N of this tag would be) and only list their indices in ``deferred``, for the slot pool to destroy
    in the background (:meth:`.pool.SlotPool.reclaim_later`): a link deletion waits for the kernel's RCU grace
    periods, ~140 ms each here, and an agent killed with 16 pre-built slots spent 2.5 s of its restart on them."""
    tagged = list_tagged(tag)
    kept = list(keep)
    keep_links, keep_netns = {s.host_veth for s in kept}, {s.netns for s in kept}
    deferred: set[int] = set()
    if defer:
        deferred |= {
            i for n in tagged.links if n not in keep_links and (i := _slot_index(n, link_prefix(tag))) is not None
        }
        deferred |= {
            i for n in tagged.netns if n not in keep_netns and (i := _slot_index(n, netns_prefix(tag))) is not None
        }
        keep_links |= {f"{link_prefix(tag)}{i}" for i in deferred}
        keep_netns |= {f"{netns_prefix(tag)}{i}" for i in deferred}
    links = 0
    doomed = [name for name in tagged.links if name not in keep_links]
    if doomed:  # a netlink socket only when something goes (a restart that adopts every slot deletes nothing)
        with IPRoute() as ipr:
            for name in doomed:
                links += _delete_link(ipr, name)
    spaces = sum(_remove_netns(name) for name in tagged.netns if name not in keep_netns)
    if links or spaces:
        log.warning("reclaimed %d leftover netns and %d links tagged %s", spaces, links, tag)
    return Reclaimed(netns=spaces, links=links, deferred=sorted(deferred))


def _slot_index(name: str, prefix: str) -> int | None:
    """N of a name ``<prefix>N`` (a slot's), else None."""
    rest = name[len(prefix) :] if name.startswith(prefix) else ""
    return int(rest) if rest.isdigit() and rest == str(int(rest)) else None


class NetlinkBuilder:
    """The real :class:`~cryobox.agent.net.pool.SlotBuilder`: netlink + nft, needs root."""

    def __init__(self, runner: Runner = run_command) -> None:
        self._runner = runner

    def create(self, slot: Slot) -> None:
        create_slot(slot, runner=self._runner)

    def destroy(self, slot: Slot) -> None:
        destroy_slot(slot)
