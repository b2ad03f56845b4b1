"""The ctnetlink client against the kernel's conntrack: two throwaway namespaces joined by a veth (10.78.x.0/24,
nothing leaves this machine), a client in one, a server and :class:`Conntrack` in the other. The server's netns
tracks because its nft table uses ``ct state``, counts bytes (``nf_conntrack_acct=1``, set inside it) and, in the
last test, rejects flows by the mark this client sets.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from pyroute2 import IPRoute, netns

from cryobox.agent.net.egress.conntrack import TCP_CLOSING_STATES, Conntrack, CtEvent, FlowKey
from tests.support.netutil import in_thread_netns, ns_fd, socket_in

MB = 1 << 20
TABLE = "cbcttest"
RULESET = f"""\
table inet {TABLE} {{
  chain input {{
    type filter hook input priority filter; policy accept;
    ct state established,related accept
  }}
}}
"""


@dataclass
class Net:
    client_ns: str
    server_ns: str
    client_ip: str
    server_ip: str

    def conntrack(self, *, events: bool = False) -> Conntrack:
        return in_thread_netns(self.server_ns, lambda: Conntrack.open(events=events))

    def nft(self, *args: str, stdin: str | None = None) -> None:
        argv = ["nsenter", f"--net=/run/netns/{self.server_ns}", "nft", *args]
        subprocess.run(argv, input=stdin, text=True, check=True, capture_output=True, timeout=10)


def _sysctl(path: str, value: str) -> None:
    with open(f"/proc/sys/{path}", "w") as f:  # /proc/sys/net resolves to this thread's netns
        f.write(value)


@pytest.fixture
def net() -> Iterator[Net]:
    tag = secrets.token_hex(4)
    sub = random.randint(0, 255)
    n = Net(f"cbct-{tag}-c", f"cbct-{tag}-s", f"10.78.{sub}.1", f"10.78.{sub}.2")
    try:
        netns.create(n.client_ns)
        netns.create(n.server_ns)

        def side(ip: str, peer_fd: int | None) -> Callable[[], None]:
            def build() -> None:
                with IPRoute() as ipr:
                    ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
                    if peer_fd is not None:
                        ipr.link("add", ifname="eth0", kind="veth", peer={"ifname": "eth0", "net_ns_fd": peer_fd})
                    idx = ipr.link_lookup(ifname="eth0")[0]
                    ipr.addr("add", index=idx, address=ip, prefixlen=24)
                    ipr.link("set", index=idx, state="up")

            return build

        fd = ns_fd(n.server_ns)
        try:
            in_thread_netns(n.client_ns, side(n.client_ip, fd))
        finally:
            os.close(fd)
        in_thread_netns(n.server_ns, side(n.server_ip, None))
        in_thread_netns(n.server_ns, lambda: _sysctl("net/netfilter/nf_conntrack_acct", "1"))
        n.nft("-f", "-", stdin=RULESET)
        yield n
    finally:
        for name in (n.client_ns, n.server_ns):  # the veth and the nft table die with their namespaces
            if name in netns.listnetns():
                netns.remove(name)


def _connect(n: Net) -> tuple[socket.socket, socket.socket, FlowKey]:
    """A connected (client, server side) pair and its flow key as the server's conntrack sees it."""
    listener = socket_in(n.server_ns)
    with listener:
        listener.bind((n.server_ip, 0))
        listener.listen(1)
        listener.settimeout(5)
        client = socket_in(n.client_ns)
        client.settimeout(5)
        client.connect(listener.getsockname())
        server, _ = listener.accept()
        server.settimeout(5)
    src, sport = client.getsockname()
    return client, server, FlowKey(src, sport, n.server_ip, int(server.getsockname()[1]))


def _recv_exactly(sock: socket.socket, size: int) -> int:
    got = 0
    while got < size:
        chunk = sock.recv(min(1 << 16, size - got))
        if not chunk:
            break
        got += len(chunk)
    return got


def _entry(ct: Conntrack, key: FlowKey) -> CtEvent | None:
    return next((e for e in ct.dump() if e.key == key), None)


def test_dump_counters_and_mark_of_a_live_flow(net: Net) -> None:
    client, server, key = _connect(net)
    with net.conntrack() as ct, client, server:
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(client.sendall, b"u" * MB)
            assert _recv_exactly(server, MB) == MB
            sent.result(5)

        entry = _entry(ct, key)
        assert entry is not None, f"{key} not in {ct.dump()}"
        assert not entry.destroyed and entry.tcp_state == 3 and entry.mark == 0  # ESTABLISHED
        counters = ct.counters(key)
        assert counters is not None
        orig, reply = counters
        assert orig >= MB and reply < MB // 4, counters  # the upload is the original direction; replies are ACKs

        assert ct.set_mark(key, 7) is True
        assert (entry := _entry(ct, key)) is not None and entry.mark == 7
        unknown = FlowKey(key.src, key.sport, key.dst, key.dport ^ 1)
        assert ct.set_mark(unknown, 7) is False
        assert ct.counters(unknown) is None
        assert all(e.key != unknown for e in ct.dump())  # set_mark never creates a flow


async def test_events_follow_a_flow_to_its_end_and_flush_destroys_it(net: Net) -> None:
    ct = net.conntrack(events=True)  # before the flow begins: events need a listener when it is created
    seen: list[CtEvent] = []
    loop = asyncio.get_running_loop()
    loop.add_reader(ct.event_fileno(), lambda: seen.extend(ct.read_events()))

    async def wait_for(what: Callable[[CtEvent], bool]) -> CtEvent:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if found := next((e for e in seen if what(e)), None):
                return found
            await asyncio.sleep(0.02)
        raise AssertionError(f"no such event among {seen}")

    def download() -> FlowKey:
        client, server, key = _connect(net)
        with client, server, ThreadPoolExecutor(1) as pool:
            sent = pool.submit(server.sendall, b"d" * MB)
            assert _recv_exactly(client, MB) == MB
            sent.result(5)
            server.close()  # the server's FIN first, then the client's
            assert client.recv(1) == b""
        return key

    try:
        key = await asyncio.to_thread(download)
        closing = await wait_for(lambda e: e.key == key and e.tcp_state in TCP_CLOSING_STATES)
        assert not closing.destroyed
        await wait_for(lambda e: e.key == key and e.tcp_state == 7)  # TIME_WAIT: both FINs acknowledged
        assert all(not e.destroyed for e in seen if e.key == key)

        ct.flush()
        gone = await wait_for(lambda e: e.key == key and e.destroyed)
        assert gone.bytes_orig is not None and gone.bytes_reply is not None, gone
        assert gone.bytes_reply >= MB > gone.bytes_orig, gone  # the download is the reply direction
        assert ct.dump() == []
        assert ct.overruns == 0
    finally:
        loop.remove_reader(ct.event_fileno())
        ct.close()
    ct.close()  # idempotent


def test_a_mark_cuts_a_live_connection_through_an_nft_rule(net: Net) -> None:
    net.nft("insert", "rule", "inet", TABLE, "input", "ct", "mark", "7", "reject", "with", "tcp", "reset")
    client, server, key = _connect(net)
    with net.conntrack() as ct, client, server:
        client.sendall(b"ping")
        assert server.recv(4) == b"ping"  # unmarked: the rule lets it through

        assert ct.set_mark(key, 7)
        client.sendall(b"x")
        with pytest.raises(ConnectionResetError):
            client.recv(1)
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.recv(1)  # the marked packet never reached the server
