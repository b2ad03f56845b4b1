"""The private network a template bake plugs its NIC into: a throwaway namespace holding only a tap.

A snapshot restores only into a QEMU with the same device list and the same netdev *type* (QEMU's user-mode
backend adds its own ``slirp`` state section), so the bake VM gets a tap exactly like a sandbox's, in a
namespace with nothing else in it: the guest has no network while baking. The namespace is named
``cryobox-bake-<pid>-<random>`` so :func:`reclaim_bakes` can remove those of dead processes only (two
processes may bake at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import AsyncIterator

from pyroute2 import IPRoute, netns

from ...util.system import in_fresh_thread, pid_alive
from ..vm import NetAttach
from .netlink import _TAP_FLAGS, _index, _remove_netns, _unshare_net
from .slots import GATEWAY_IP, GATEWAY_MAC, GUEST_PREFIXLEN, NETNS_DIR, TAP

log = logging.getLogger(__name__)
PREFIX = "cryobox-bake-"


def _build(name: str) -> None:
    _unshare_net()
    netns.attach(name, "thread-self")
    with IPRoute() as ns:
        ns.link("set", index=_index(ns, "lo"), state="up")
        ns.link("add", ifname=TAP, kind="tuntap", mode="tap", ifr=_TAP_FLAGS)
        tap = _index(ns, TAP)
        ns.link("set", index=tap, address=GATEWAY_MAC, state="up")
        ns.addr("add", index=tap, address=GATEWAY_IP, prefixlen=GUEST_PREFIXLEN)


def create_bake_netns() -> str:
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
    try:
        in_fresh_thread(lambda: _build(name))
    except BaseException:
        _remove_netns(name)
        raise
    return name


@contextlib.asynccontextmanager
async def bake_network() -> AsyncIterator[NetAttach]:
    """A namespace with a tap for one bake; removed afterwards (also when the bake fails)."""
    name = await asyncio.to_thread(create_bake_netns)
    try:
        yield NetAttach(name, TAP)
    finally:
        await asyncio.to_thread(_remove_netns, name)


def reclaim_bakes() -> int:
    """Remove bake namespaces left by processes that died mid-bake; returns how many went."""
    removed = 0
    for name in netns.listnetns(str(NETNS_DIR)):
        if not name.startswith(PREFIX):
            continue
        pid_text = name[len(PREFIX) :].split("-", 1)[0]
        if pid_text.isdigit() and not pid_alive(int(pid_text)):
            removed += _remove_netns(name)
    if removed:
        log.warning("removed %d bake namespace(s) of dead processes", removed)
    return removed
