"""The NFQUEUE client against the real kernel: three throwaway namespaces (client -- router -- server, veths,
10.77.x.x/24, nothing leaves this machine), the queue opened inside the router, xtables rules (iptables-nft: this
kernel has no nft ``queue`` expression) queueing the client's TCP to the server's port, and an nft chain after
them that turns the verdict's mark into a conntrack mark (allow: the rest of the flow skips the queue) or a reset.
"""

from __future__ import annotations

import errno
import hashlib
import secrets
import select
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from cryobox.agent.net.egress.nfqueue import NF_ACCEPT, NF_DROP, NF_REPEAT, NfQueue, QueuedPacket
from tests.support.netutil import in_thread_netns, socket_in

QUEUE = 5
SERVER_IP, PORT = "10.77.2.2", 8080
ALLOW, DENY, PRESET = 0x1, 0x2, 0x100
Decide = Callable[[QueuedPacket], tuple[int, int | None]]


def run(*argv: str, stdin: str | None = None) -> None:
    subprocess.run(argv, input=stdin, text=True, check=True, capture_output=True, timeout=30)


@dataclass
class Server:
    """Reads each connection to its end and answers with the SHA-256 of what it read."""

    sock: socket.socket
    conns: list[socket.socket] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock.settimeout(0.1)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.sock.fileno() >= 0:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        digest = hashlib.sha256()
        try:
            while data := conn.recv(1 << 16):
                digest.update(data)
            conn.sendall(digest.hexdigest().encode())
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


@dataclass
class Rig:
    client: str
    router: str
    server: str

    def rules(self, *, bypass: bool = False, strict: bool = False, preset_mark: bool = False) -> None:
        """Queue the client's unmarked, undecided TCP to the server's port; ``strict``: nft resets what comes to
        it unmarked and undecided; ``preset_mark``: mark those packets PRESET first (and queue on that mark)."""
        match = f"-m mark --mark {PRESET:#x}" if preset_mark else "-m connmark --mark 0 -m mark --mark 0"
        mangle = f"*mangle\n-A FORWARD -p tcp --dport {PORT} -j MARK --set-mark {PRESET:#x}\nCOMMIT\n"
        table = (mangle if preset_mark else "") + (
            f"*filter\n:FORWARD ACCEPT [0:0]\n-A FORWARD -p tcp -d {SERVER_IP} --dport {PORT} {match} "
            f"-j NFQUEUE --queue-num {QUEUE}{' --queue-bypass' if bypass else ''}\nCOMMIT\n"
        )
        self.ns(self.router, "iptables-nft-restore", stdin=table)
        last = f"meta mark 0 ct mark 0 tcp dport {PORT} reject with tcp reset" if strict else ""
        chain = f"""
            table inet nfqtest {{
                chain forward {{
                    type filter hook forward priority 10; policy accept;
                    meta mark {ALLOW:#x} ct mark set {ALLOW:#x} accept
                    meta mark {DENY:#x} reject with tcp reset
                    ct mark {ALLOW:#x} accept
                    {last}
                }}
            }}"""
        self.ns(self.router, "nft", "-f", "-", stdin=chain)

    def ns(self, name: str, *argv: str, stdin: str | None = None) -> None:
        run("nsenter", f"--net=/run/netns/{name}", *argv, stdin=stdin)

    def queue(self, name: str | None = None) -> NfQueue:
        return in_thread_netns(name or self.router, lambda: NfQueue.open(QUEUE))

    def connect(self, timeout: float) -> socket.socket:
        """A connection from the client to the server."""
        sock = socket_in(self.client)
        sock.settimeout(timeout)
        try:
            sock.connect((SERVER_IP, PORT))
        except BaseException:
            sock.close()
            raise
        return sock

    def upload(self, size: int, timeout: float = 5.0) -> bytes:
        """Send ``size`` bytes from the client, then half-close; what the server answers."""
        with self.connect(timeout) as sock:
            sock.sendall(bytes(range(256)) * (size // 256))
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            while data := sock.recv(4096):
                answer += data
            return answer


@pytest.fixture
def rig() -> Iterator[Rig]:
    tag = secrets.token_hex(3)
    rig = Rig(f"nfqt-{tag}-client", f"nfqt-{tag}-router", f"nfqt-{tag}-server")
    made: list[str] = []
    server: Server | None = None
    try:
        for name in (rig.client, rig.router, rig.server):
            run("ip", "netns", "add", name)
            made.append(name)
            run("ip", "-n", name, "link", "set", "lo", "up")
        # Both veths are created inside the router with their peers moved straight into the other namespaces, so
        # no link ever exists in this host's namespace and each goes away with its namespace.
        for peer, net, ip in ((rig.client, 1, "10.77.1.2"), (rig.server, 2, "10.77.2.2")):
            link = f"r{net}"
            run("ip", "-n", rig.router, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", peer)
            run("ip", "-n", rig.router, "addr", "add", f"10.77.{net}.1/24", "dev", link)
            run("ip", "-n", rig.router, "link", "set", link, "up")
            run("ip", "-n", peer, "addr", "add", f"{ip}/24", "dev", "eth0")
            run("ip", "-n", peer, "link", "set", "eth0", "up")
            run("ip", "-n", peer, "route", "add", "default", "via", f"10.77.{net}.1")
        rig.ns(rig.router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        listener = socket_in(rig.server)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((SERVER_IP, PORT))
        listener.listen(16)
        server = Server(listener)
        yield rig
    finally:
        if server is not None:
            server.close()
        for name in made:
            for link in ("r1", "r2"):
                subprocess.run(["ip", "-n", name, "link", "del", link], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


class Handler:
    """Answers every queued packet on its own thread with ``decide(packet)`` -> (verdict, mark)."""

    def __init__(self, queue: NfQueue, decide: Decide) -> None:
        self.queue, self.decide = queue, decide
        self.seen: list[QueuedPacket] = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if select.select([self.queue], [], [], 0.05)[0]:
                    for packet in self.queue.read():
                        self.seen.append(packet)
                        verdict, mark = self.decide(packet)
                        self.queue.verdict(packet.id, verdict, mark=mark)
        except BaseException as exc:
            self.failure = exc

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.queue.close()
        if self.failure is not None:
            raise self.failure


def tcp_payload(packet: bytes) -> bytes:
    ihl = (packet[0] & 0xF) * 4
    return packet[ihl + (packet[ihl + 12] >> 4) * 4 : int.from_bytes(packet[2:4], "big")]


def test_allowed_flow_passes_and_only_its_start_is_queued(rig: Rig) -> None:
    rig.rules()
    handler = Handler(rig.queue(), lambda p: (NF_REPEAT, ALLOW))
    try:
        size = 1 << 20
        assert rig.upload(size) == hashlib.sha256(bytes(range(256)) * (size // 256)).hexdigest().encode()
    finally:
        handler.close()
    assert 1 <= len(handler.seen) < 10  # the SYN decides: conntrack carries ALLOW for ~750 segments more
    syn = handler.seen[0].packet
    assert syn[0] >> 4 == 4 and syn[9] == socket.IPPROTO_TCP  # from the IP header on
    assert socket.inet_ntoa(syn[16:20]) == SERVER_IP
    ihl = (syn[0] & 0xF) * 4
    assert int.from_bytes(syn[ihl + 2 : ihl + 4], "big") == PORT and syn[ihl + 13] & 0x02  # SYN
    assert handler.seen[0].mark == 0
    assert handler.queue.overruns == 0 and handler.queue.errors == 0


def test_queued_packet_carries_its_mark(rig: Rig) -> None:
    rig.rules(preset_mark=True)
    handler = Handler(rig.queue(), lambda p: (NF_ACCEPT, None))
    try:
        assert len(rig.upload(1000)) == 64
    finally:
        handler.close()
    assert handler.seen and all(p.mark == PRESET for p in handler.seen)


def test_denied_first_payload_resets_the_client(rig: Rig) -> None:
    rig.rules()
    handler = Handler(rig.queue(), lambda p: (NF_REPEAT, DENY) if tcp_payload(p.packet) else (NF_ACCEPT, None))
    try:
        with rig.connect(timeout=3) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n")
            with pytest.raises(ConnectionResetError):
                sock.recv(4096)
    finally:
        handler.close()
    assert any(tcp_payload(p.packet) for p in handler.seen)


def test_drop_verdict_times_the_client_out(rig: Rig) -> None:
    rig.rules()
    handler = Handler(rig.queue(), lambda p: (NF_DROP, None))
    try:
        with pytest.raises(TimeoutError):
            rig.connect(timeout=1).close()
    finally:
        handler.close()
    assert handler.seen  # the SYN got here and was dropped


def test_no_reader_with_bypass_goes_on_to_nft(rig: Rig) -> None:
    rig.rules(bypass=True, strict=True)
    with pytest.raises(ConnectionRefusedError):  # the nft chain saw the SYN unmarked and reset it
        rig.connect(timeout=3).close()


def test_no_reader_without_bypass_drops(rig: Rig) -> None:
    rig.rules(bypass=False, strict=True)
    with pytest.raises(TimeoutError):
        rig.connect(timeout=1).close()


def test_second_open_of_a_queue_is_refused(rig: Rig) -> None:
    first = rig.queue()
    try:
        with pytest.raises(OSError) as refused:
            rig.queue()
        assert refused.value.errno == errno.EPERM  # another socket owns it (EBUSY is the owner binding again)
        rig.queue(rig.client).close()  # the same number in another namespace is another queue
    finally:
        first.close()
        first.close()
    rig.queue().close()  # closing the owner released it
