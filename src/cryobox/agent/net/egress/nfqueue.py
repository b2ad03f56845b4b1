"""A small NFQUEUE client: packets that an ``NFQUEUE`` rule hands to userspace are read from one raw
``AF_NETLINK``/``NETLINK_NETFILTER`` socket (the nfnetlink_queue subsystem) and answered with a verdict on the same
socket, optionally with a new skb mark (``NF_REPEAT`` + mark: the packet goes through its hook again, where rules
can match the mark and save it to conntrack so the rest of the flow never comes back here).

Why raw netlink: PyPI has no maintained, asyncio-friendly NFQUEUE binding that needs no C build (the bindings wrap
libnetfilter_queue), while the protocol is a handful of fixed structs; the spike that chose this approach measured
it doing the job. The socket is non-blocking after :meth:`NfQueue.open`, so an event
loop can wait on :meth:`NfQueue.fileno` and call :meth:`NfQueue.read` when it is readable.

Kernel behaviour worth knowing: a queue belongs to the network namespace of the thread that opened its socket
(open it on a thread inside that netns); it exists while the socket is open (closing it unbinds the queue); a
second socket binding a bound queue number is refused (``EPERM``, the same socket again ``EBUSY``); a packet
queued with nobody bound is dropped unless the rule says ``--queue-bypass``. Fail-open is never set here: a full
queue drops packets instead of letting them through undecided.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from dataclasses import dataclass

from .nlwire import NLMSG, attr, attrs, messages

NETLINK_NETFILTER = 12
SO_RCVBUFFORCE = 33  # not in Python's socket module
RCVBUF = 8 << 20
RECV_SIZE = 1 << 17  # one message: up to 0xFFFF bytes of packet plus the headers and attributes around it
SETUP_TIMEOUT_S = 5.0

NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK = 1, 4

NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND, NFQNL_CFG_CMD_PF_BIND = 1, 3
NFQNL_COPY_PACKET = 2
COPY_RANGE = 0xFFFF
NFQA_PACKET_HDR, NFQA_VERDICT_HDR, NFQA_MARK, NFQA_PAYLOAD = 1, 2, 3, 10

NF_DROP, NF_ACCEPT, NF_REPEAT = 0, 1, 4
"""Verdicts: drop the packet; let it continue after the queueing rule; run its hook again (with the new mark)."""

_NFGEN = struct.Struct("!BBH")  # nfgenmsg: family, version, res_id (the queue number, big-endian)
_HEADERS = NLMSG.size + _NFGEN.size


@dataclass(frozen=True, slots=True)
class QueuedPacket:
    """One packet waiting for its verdict."""

    id: int
    """The kernel's packet id (give it to :meth:`NfQueue.verdict`)."""
    packet: bytes
    """The IPv4 packet from its IP header on (up to 65535 bytes)."""
    mark: int
    """The skb mark as queued (0 when the kernel sent none)."""


class NfQueue:
    """One queue's netlink socket; the queue lives in the network namespace of the thread that opened it.

    Not thread-safe: read and answer from one thread (or one event loop)."""

    def __init__(self, sock: socket.socket, queue: int) -> None:
        self._sock = sock
        self.queue = queue
        self._seq = 0
        self._pending: list[QueuedPacket] = []  # packets that arrived while open() waited for its ACKs
        self.overruns = 0
        """How many times the kernel reported ENOBUFS (it dropped messages for this socket: its buffer was full)."""
        self.errors = 0
        """Netlink error messages about our own requests after setup (e.g. a verdict for an unknown packet id)."""

    @classmethod
    def open(cls, queue: int = 0, *, max_len: int = 4096) -> NfQueue:
        """Bind queue number ``queue`` (AF_INET, whole packets up to 0xFFFF bytes, at most ``max_len`` waiting
        for a verdict). Blocks until the kernel has acknowledged every step.

        :raises OSError: the kernel refused (``EPERM``: another socket has the queue; ``EBUSY``: this one has)."""
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
        try:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
            except PermissionError:  # no CAP_NET_ADMIN: capped at net.core.rmem_max
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            sock.bind((0, 0))
            sock.settimeout(SETUP_TIMEOUT_S)
            self = cls(sock, queue)
            # PF_BIND is a no-op on kernels since 3.8 (one handler for every family), needed before that.
            cmd = struct.pack("!BxH", NFQNL_CFG_CMD_PF_BIND, socket.AF_INET)
            self._configure(socket.AF_INET, 0, attr(NFQA_CFG_CMD, cmd))
            # One message: the kernel creates the queue and sets its mode in the same call.
            self._configure(
                socket.AF_UNSPEC,
                queue,
                attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0))
                + attr(NFQA_CFG_PARAMS, struct.pack("!IB", COPY_RANGE, NFQNL_COPY_PACKET))
                + attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", max_len)),
            )
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return self

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self) -> list[QueuedPacket]:
        """Every packet available now, without blocking (``[]`` when none). An ENOBUFS (the kernel dropped
        messages) ends the read and counts in :attr:`overruns`; error messages count in :attr:`errors`.

        :raises OSError: the socket failed otherwise."""
        out, self._pending = self._pending, []
        while True:
            try:
                data = self._sock.recv(RECV_SIZE)
            except BlockingIOError:
                return out
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                self.overruns += 1
                return out
            self._take(data, out, ack=0)

    def verdict(self, packet_id: int, verdict: int, *, mark: int | None = None, packet: bytes | None = None) -> None:
        """Decide packet ``packet_id`` (``NF_ACCEPT``, ``NF_DROP``, ``NF_REPEAT``); ``mark`` replaces its skb mark,
        ``packet`` its contents (a whole IPv4 packet, checksums right). No ACK is requested: a refused verdict shows
        up as an error message in a later :meth:`read`."""
        attrs = attr(NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id))
        if mark is not None:
            attrs += attr(NFQA_MARK, struct.pack("!I", mark))
        if packet is not None:
            attrs += attr(NFQA_PAYLOAD, packet)
        self._send(NFQNL_MSG_VERDICT, socket.AF_UNSPEC, self.queue, attrs, NLM_F_REQUEST)

    def close(self) -> None:
        """Close the socket, which unbinds the queue (idempotent)."""
        self._sock.close()

    def __enter__(self) -> NfQueue:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _send(self, kind: int, family: int, res_id: int, attrs: bytes, flags: int) -> int:
        self._seq = self._seq % 0xFFFFFFFF + 1  # never 0, which is what the kernel's own messages carry
        body = _NFGEN.pack(family, 0, res_id) + attrs
        header = NLMSG.pack(_HEADERS + len(attrs), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, self._seq, 0)
        self._sock.send(header + body)
        return self._seq

    def _configure(self, family: int, res_id: int, attrs: bytes) -> None:
        seq = self._send(NFQNL_MSG_CONFIG, family, res_id, attrs, NLM_F_REQUEST | NLM_F_ACK)
        while (code := self._take(self._sock.recv(RECV_SIZE), self._pending, ack=seq)) is None:
            pass
        if code:
            raise OSError(code, f"nfqueue {self.queue}: {os.strerror(code)}")

    def _take(self, data: bytes, out: list[QueuedPacket], *, ack: int) -> int | None:
        """Append the packets in ``data`` to ``out``; the errno of the ACK for sequence ``ack`` if there is one."""
        code: int | None = None
        for kind, seq, body in messages(memoryview(data)):
            if kind == NLMSG_ERROR and len(body) >= 4:
                error = -struct.unpack_from("=i", body)[0]
                if ack and seq == ack:
                    code = error
                elif error:
                    self.errors += 1
            elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                found = attrs(body[_NFGEN.size :])
                header = found.get(NFQA_PACKET_HDR)
                if header is None or len(header) < 4:
                    continue
                mark = found.get(NFQA_MARK)
                out.append(
                    QueuedPacket(
                        id=struct.unpack_from("!I", header)[0],
                        packet=bytes(found.get(NFQA_PAYLOAD, memoryview(b""))),
                        mark=struct.unpack_from("!I", mark)[0] if mark is not None and len(mark) >= 4 else 0,
                    )
                )
        return code


__all__ = ["NF_ACCEPT", "NF_DROP", "NF_REPEAT", "NfQueue", "QueuedPacket"]
