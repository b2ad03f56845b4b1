"""Small OS helpers of the fleet harness: commands, signals, PIDs, and threads that enter a network namespace."""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from ...util.system import in_fresh_thread
from ...util.tcp import tcp_socket

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child (as ``preexec_fn``, or first thing in its main): SIGKILL me when the thread that spawned me dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True, timeout: float = 60.0) -> str:
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return proc.stdout


def kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def in_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` on a brand-new thread that ends afterwards (it may leave that thread in another netns)."""
    return in_fresh_thread(fn, name="cbxfleet-netns")


def setns(path: Path) -> None:
    """Move the *calling thread* into the network namespace at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def socket_in_netns(path: Path, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket that belongs to the network namespace at ``path`` (usable from any thread afterwards)."""

    def make() -> socket.socket:
        setns(path)
        return tcp_socket(family) if kind == socket.SOCK_STREAM else socket.socket(family, kind)

    return in_thread(make)


def ipv4_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 address (as its network) and route of the root namespace."""
    out: list[ipaddress.IPv4Network] = []
    for link in json.loads(run(["ip", "-j", "-4", "addr", "show"]) or "[]"):
        for addr in link.get("addr_info", []):
            with contextlib.suppress(KeyError, ValueError):
                out.append(ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    for route in json.loads(run(["ip", "-j", "-4", "route", "show", "table", "all"]) or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                out.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
    return out
