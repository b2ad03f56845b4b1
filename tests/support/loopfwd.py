"""A browser of its own network namespace, and a way back to this host's loopback: Chromium aborts every request
in flight with ``ERR_NETWORK_CHANGED`` whenever an interface of its namespace comes or goes, and the suite's other
tests create and remove network slots all the time. In a namespace of its own the browser sees none of that; a
forwarder listening on ``127.0.0.1:<port>`` inside it relays each connection to the same port of the host's
loopback (the test server), so the browser uses the server's own URL. A port may also be relayed to another one
(``443`` inside to a test server's HTTPS port)."""

from __future__ import annotations

import contextlib
import secrets
import socket
import subprocess
import threading
from pathlib import Path

from tests.support.netutil import in_thread_netns

CHUNK = 65536


def _relay(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while chunk := source.recv(CHUNK):
            sink.sendall(chunk)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class Relays:
    """Listeners in network namespaces, each relaying every connection to an address of this host's namespace
    (its loopback, usually). :meth:`close` stops them and ends their connections (idempotent)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._listeners: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._open: set[socket.socket] = set()

    def add(self, netns: str, bind: tuple[str, int], target: tuple[str, int]) -> None:
        """Listen on ``bind`` inside ``netns``; relay each connection to ``target`` (in the host's namespace)."""
        listener = in_thread_netns(netns, lambda: self._listen(bind))
        self._listeners.append(listener)
        thread = threading.Thread(target=self._accept, args=(listener, target), daemon=True)
        thread.start()
        self._threads.append(thread)

    @staticmethod
    def _listen(bind: tuple[str, int]) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(bind)
        sock.listen(64)
        sock.settimeout(0.2)
        return sock

    def _accept(self, listener: socket.socket, target: tuple[str, int]) -> None:
        while not self._stop.is_set():
            try:
                inside, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                outside = socket.create_connection(target, timeout=10)
            except OSError:
                inside.close()
                continue
            inside.settimeout(None)
            outside.settimeout(None)
            self._open.update((inside, outside))
            thread = threading.Thread(target=self._pair, args=(inside, outside), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _pair(self, inside: socket.socket, outside: socket.socket) -> None:
        back = threading.Thread(target=_relay, args=(outside, inside), daemon=True)
        back.start()
        _relay(inside, outside)
        back.join()
        for sock in (inside, outside):
            self._open.discard(sock)
            sock.close()

    def close(self) -> None:
        self._stop.set()
        for listener in self._listeners:
            listener.close()
        for sock in list(self._open):  # connections still open: their relays end, and close them
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)
        self._listeners.clear()
        self._threads.clear()


class LoopbackNamespace:
    """A network namespace with only ``lo`` up, where ``127.0.0.1:<port>`` reaches the host's ``127.0.0.1:<port>``
    for every port in ``ports``. :meth:`close` removes it all (idempotent)."""

    def __init__(self, ports: list[int]) -> None:
        self.name = f"cryobox-{secrets.token_hex(3)}-br"
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        self._relays = Relays()
        try:
            subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)
            for port in ports:
                self.add(port)
        except BaseException:
            self.close()
            raise

    def add(self, port: int, to: int | None = None) -> None:
        """Forward ``port`` too (a server started later), to the host's ``to`` (default: the same port)."""
        self._relays.add(self.name, ("127.0.0.1", port), ("127.0.0.1", port if to is None else to))

    def wrapper(self, executable: Path, directory: Path) -> Path:
        """A script that runs ``executable`` inside the namespace (Playwright talks to it over pipes)."""
        script = directory / "in-netns.sh"
        script.write_text(f'#!/bin/sh\nexec nsenter --net=/run/netns/{self.name} {executable} "$@"\n')
        script.chmod(0o755)
        return script

    def close(self) -> None:
        self._relays.close()
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)
