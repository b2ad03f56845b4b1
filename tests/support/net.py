"""Fakes of a host's network plumbing for unit tests without root: an nft that records the scripts the firewall
sends, and a slot builder that only records."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from cryobox.agent.net import Slot


class FakeNft:
    """Records the scripts ``Firewall`` sends (``nft -f -``); lists the ``inet`` tables named in ``tables``."""

    def __init__(self) -> None:
        self.scripts: list[str] = []
        self.tables: list[str] = []

    def __call__(self, argv: Sequence[str], stdin: str | None) -> str:
        if list(argv[:3]) == ["nft", "list", "tables"]:
            return "".join(f"table inet {t}\n" for t in self.tables)
        assert list(argv) == ["nft", "-f", "-"] and stdin is not None
        self.scripts.append(stdin)
        return ""


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
