"""Fakes of a host's network plumbing for unit tests without root: an nft that keeps an egress set the way the
kernel would (from the scripts the firewall sends), a slot builder and an egress clearer that only record."""

from __future__ import annotations

import ipaddress
import json
import re
import threading
from collections.abc import Sequence

from cryobox.agent.net import Slot


class FakeNft:
    """Keeps an egress set the way the kernel would, from the scripts ``Firewall`` sends."""

    def __init__(self) -> None:
        self.scripts: list[str] = []
        self.elements: set[tuple[str, str]] = set()

    def __call__(self, argv: Sequence[str], stdin: str | None) -> str:
        if list(argv[:3]) == ["nft", "-j", "list"]:
            elems = [{"concat": [a, self._member(n)]} for a, n in sorted(self.elements)]
            return json.dumps({"nftables": [{"metainfo": {}}, {"set": {"name": "egress", "elem": elems}}]})
        if list(argv[:3]) == ["nft", "list", "tables"]:
            return ""
        assert list(argv) == ["nft", "-f", "-"] and stdin is not None
        self.scripts.append(stdin)
        for line in stdin.splitlines():
            m = re.match(r"(add|delete) element inet \S+ egress \{ (.*) \}$", line)
            if not m:
                continue
            for item in m.group(2).split(", "):
                addr, net = item.split(" . ")
                key = (addr, str(ipaddress.IPv4Network(net)))
                if m.group(1) == "add":
                    self.elements.add(key)
                else:
                    assert key in self.elements, f"kernel would refuse deleting missing {key}"
                    self.elements.remove(key)
        return ""

    @staticmethod
    def _member(net: str) -> object:
        n = ipaddress.IPv4Network(net)
        if n.prefixlen == 32:
            return str(n.network_address)
        return {"prefix": {"addr": str(n.network_address), "len": n.prefixlen}}


class FakeBuilder:
    def __init__(self) -> None:
        self.created: list[int] = []
        self.destroyed: list[int] = []
        self.live: set[int] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.fail_next = False

    def create(self, slot: Slot) -> None:
        assert self.gate.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise OSError("boom")
        assert slot.index not in self.live, "two live slots with one index"
        self.live.add(slot.index)
        self.created.append(slot.index)

    def destroy(self, slot: Slot) -> None:
        self.live.discard(slot.index)
        self.destroyed.append(slot.index)


class FakeEgress:
    def __init__(self) -> None:
        self.cleared: list[int] = []
        self.fail = False

    def clear_egress(self, slot: Slot) -> None:
        if self.fail:
            raise OSError("nft went away")
        self.cleared.append(slot.index)
