"""A small ctnetlink (nfnetlink conntrack) client for IPv4 TCP flows: list them, read their byte counters, set
their mark (which nft can match: ``ct mark 7 reject with tcp reset`` cuts a live connection) and follow their
state changes and ends as events.

The sockets are plain ``AF_NETLINK``/``NETLINK_NETFILTER`` sockets, so they belong to the network namespace of the
thread that created them (open a :class:`Conntrack` on a short-lived thread moved into the slot's netns, like
:mod:`cryobox.agent.net.netlink` does) and keep it whatever thread uses them afterwards. Two of them:

* the request socket is blocking with a short timeout: every request is a microsecond kernel round trip, answered
  before its ACK (or ``NLMSG_DONE`` for a dump), and fails with :class:`OSError` (``ENOENT`` is turned into
  ``False``/``None`` where the flow may simply be gone). One request at a time: not for concurrent threads.
* the event socket (``events=True``) is non-blocking and close-on-exec, for the caller's event loop to watch with
  ``add_reader``. It joins only ``NFNLGRP_CONNTRACK_UPDATE`` and ``NFNLGRP_CONNTRACK_DESTROY``: a flow's
  confirmation (``IPCTNL_MSG_CT_NEW`` with ``NLM_F_CREATE``) goes to the NEW group, so it is not seen here; its
  later state changes (``SYN_RECV`` -> ``ESTABLISHED`` -> the closing states) and mark changes are. Its buffer is
  large (``SO_RCVBUFFORCE``, root) and ``NETLINK_NO_ENOBUFS`` is *not* set: an overflow loses events either way,
  but this way it is counted in :attr:`Conntrack.overruns` instead of passing unnoticed.

Kernel facts a user of this module relies on (per netns, decided when a flow *begins*, so set them up first):
conntrack only tracks in a netns where some rule uses it (an nft ``ct`` expression); counters exist only with
``net.netfilter.nf_conntrack_acct=1``; events exist only if a listener was subscribed (the default
``nf_conntrack_events=2``). Counters come with ``GET``/dump answers and DESTROY events, not with UPDATE events.

Encoding is hand-rolled with :mod:`struct` rather than pyroute2's ``nfct_msg``: the wire format needed is one
nlmsghdr, a 4-byte nfgenmsg and a dozen attributes (a 40-line encoder/decoder here), whereas pyroute2's message
classes are untyped for ``mypy --strict`` (everything ``Any``), encode from name/value lists in which a misspelt
attribute name is silently dropped, and would still need a walk through nested ``get_attr`` calls to decode.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from dataclasses import dataclass

from .nlwire import NLMSG, attr, attrs, messages

NETLINK_NETFILTER, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, SO_RCVBUFFORCE = 12, 270, 1, 33
NFNLGRP_CONNTRACK_UPDATE, NFNLGRP_CONNTRACK_DESTROY = 2, 3

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300

NFNL_SUBSYS_CTNETLINK = 1
IPCTNL_MSG_CT_NEW, IPCTNL_MSG_CT_GET, IPCTNL_MSG_CT_DELETE = 0, 1, 2
_CT_NEW = NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW
_CT_DELETE = NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_DELETE

CTA_TUPLE_ORIG, CTA_PROTOINFO, CTA_MARK, CTA_COUNTERS_ORIG, CTA_COUNTERS_REPLY = 1, 4, 8, 9, 10
CTA_TUPLE_IP, CTA_TUPLE_PROTO = 1, 2
CTA_IP_V4_SRC, CTA_IP_V4_DST = 1, 2
CTA_PROTO_NUM, CTA_PROTO_SRC_PORT, CTA_PROTO_DST_PORT = 1, 2, 3
CTA_PROTOINFO_TCP = CTA_PROTOINFO_TCP_STATE = 1
CTA_COUNTERS_BYTES, CTA_COUNTERS32_BYTES = 2, 4

TCP_CONNTRACK_FIN_WAIT, TCP_CONNTRACK_CLOSE = 4, 8
TCP_CLOSING_STATES = frozenset(range(TCP_CONNTRACK_FIN_WAIT, TCP_CONNTRACK_CLOSE + 1))
"""FIN_WAIT, CLOSE_WAIT, LAST_ACK, TIME_WAIT, CLOSE: one side has sent a FIN (or a RST)."""

REQUEST_TIMEOUT_S = 1.0
EVENT_RCVBUF = 8 << 20
RECV_SIZE = 1 << 17  # larger than any netlink dump skb, so nothing is truncated
MAX_READS = 1024  # datagrams per read_events call: a flood cannot keep the caller's loop in here forever

_NFGEN = struct.Struct("=BBH")  # nfgenmsg: family, version, res_id


@dataclass(frozen=True, slots=True)
class FlowKey:
    """A TCP flow's original-direction tuple (before NAT), as conntrack keys it."""

    src: str
    sport: int
    dst: str
    dport: int


@dataclass(frozen=True, slots=True)
class CtEvent:
    """One conntrack entry as an event or a dump line reports it."""

    key: FlowKey
    destroyed: bool  # True for a DESTROY event, False for an UPDATE event (and for dump lines)
    tcp_state: int | None  # TCP_CONNTRACK_* (ESTABLISHED=3 ... CLOSE=8) when carried (UPDATE: on a state change)
    mark: int
    bytes_orig: int | None  # bytes with IP headers; None unless accounting was on as the flow began
    bytes_reply: int | None


def _tuple(key: FlowKey) -> bytes:
    ip = attr(CTA_IP_V4_SRC, socket.inet_aton(key.src)) + attr(CTA_IP_V4_DST, socket.inet_aton(key.dst))
    proto = (
        attr(CTA_PROTO_NUM, bytes([socket.IPPROTO_TCP]))
        + attr(CTA_PROTO_SRC_PORT, struct.pack("!H", key.sport))
        + attr(CTA_PROTO_DST_PORT, struct.pack("!H", key.dport))
    )
    inner = attr(CTA_TUPLE_IP, ip, nested=True) + attr(CTA_TUPLE_PROTO, proto, nested=True)
    return attr(CTA_TUPLE_ORIG, inner, nested=True)


def _bytes(counters: bytes | None) -> int | None:
    if counters is None:
        return None
    found = attrs(counters)
    raw = found.get(CTA_COUNTERS_BYTES, found.get(CTA_COUNTERS32_BYTES))
    return int.from_bytes(raw, "big") if raw else None


def _entry(payload: bytes, *, destroyed: bool) -> CtEvent | None:
    """The entry in a ctnetlink message's payload (nfgenmsg + attributes); None unless it is IPv4 TCP."""
    if len(payload) < _NFGEN.size or payload[0] != socket.AF_INET:
        return None
    top = attrs(payload[_NFGEN.size :])
    orig = attrs(top.get(CTA_TUPLE_ORIG, b""))
    ip, proto = attrs(orig.get(CTA_TUPLE_IP, b"")), attrs(orig.get(CTA_TUPLE_PROTO, b""))
    try:
        if proto[CTA_PROTO_NUM][0] != socket.IPPROTO_TCP:
            return None
        key = FlowKey(
            socket.inet_ntoa(ip[CTA_IP_V4_SRC]),
            struct.unpack("!H", proto[CTA_PROTO_SRC_PORT])[0],
            socket.inet_ntoa(ip[CTA_IP_V4_DST]),
            struct.unpack("!H", proto[CTA_PROTO_DST_PORT])[0],
        )
    except (KeyError, IndexError, struct.error, OSError):  # malformed: not ours to guess at
        return None
    state = attrs(attrs(top.get(CTA_PROTOINFO, b"")).get(CTA_PROTOINFO_TCP, b"")).get(CTA_PROTOINFO_TCP_STATE)
    mark = top.get(CTA_MARK)
    return CtEvent(
        key=key,
        destroyed=destroyed,
        tcp_state=state[0] if state else None,
        mark=int.from_bytes(mark, "big") if mark else 0,
        bytes_orig=_bytes(top.get(CTA_COUNTERS_ORIG)),
        bytes_reply=_bytes(top.get(CTA_COUNTERS_REPLY)),
    )


class Conntrack:
    """ctnetlink sockets bound in the network namespace of the thread that opened them."""

    def __init__(self, request: socket.socket, events: socket.socket | None) -> None:
        self._request_sock = request
        self._event_sock = events
        self._seq = 0
        self._closed = False
        self.overruns = 0
        """How many times the event socket overflowed (``ENOBUFS``): events were lost in between."""

    @classmethod
    def open(cls, *, events: bool = False) -> Conntrack:
        """Open the sockets in the calling thread's netns (blocking, but only for the few syscalls)."""
        request = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
        event: socket.socket | None = None
        try:
            request.bind((0, 0))
            request.settimeout(REQUEST_TIMEOUT_S)
            if events:
                flags = socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
                event = socket.socket(socket.AF_NETLINK, flags, NETLINK_NETFILTER)
                event.setblocking(False)
                try:
                    event.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, EVENT_RCVBUF)
                except PermissionError:  # without CAP_NET_ADMIN: capped at net.core.rmem_max
                    event.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, EVENT_RCVBUF)
                event.bind((0, 0))
                for group in (NFNLGRP_CONNTRACK_UPDATE, NFNLGRP_CONNTRACK_DESTROY):
                    event.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)
        except BaseException:
            request.close()
            if event is not None:
                event.close()
            raise
        return cls(request, event)

    def event_fileno(self) -> int:
        """The event socket's fd, for ``loop.add_reader``; :meth:`read_events` when it is readable."""
        return self._events().fileno()

    def read_events(self) -> list[CtEvent]:
        """Every IPv4 TCP event queued now (never blocks); an overflow is counted in :attr:`overruns`."""
        sock, found = self._events(), []
        for _ in range(MAX_READS):
            try:
                data = sock.recv(RECV_SIZE)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                self.overruns += 1
                continue
            for kind, _seq, payload in messages(data):
                if kind in (_CT_NEW, _CT_DELETE) and (event := _entry(payload, destroyed=kind == _CT_DELETE)):
                    found.append(event)
        return found

    def set_mark(self, key: FlowKey, mark: int) -> bool:
        """Set the flow's conntrack mark; False when there is no such flow (it is never created)."""
        try:
            self._request(IPCTNL_MSG_CT_NEW, NLM_F_ACK, _tuple(key) + attr(CTA_MARK, struct.pack("!I", mark)))
        except FileNotFoundError:
            return False
        return True

    def counters(self, key: FlowKey) -> tuple[int, int] | None:
        """(bytes original, bytes reply) of the flow, None when there is no such flow.

        The kernel also finds a flow by its reply tuple; the counters are always in the entry's own directions.

        :raises OSError: ``ENODATA`` when the entry has no counters (accounting was off as the flow began).
        """
        try:
            answers = self._request(IPCTNL_MSG_CT_GET, NLM_F_ACK, _tuple(key))
        except FileNotFoundError:
            return None
        for payload in answers:
            if (entry := _entry(payload, destroyed=False)) is None:
                continue
            if entry.bytes_orig is None or entry.bytes_reply is None:
                raise OSError(errno.ENODATA, "conntrack entry without counters (net.netfilter.nf_conntrack_acct)")
            return entry.bytes_orig, entry.bytes_reply
        raise OSError(errno.EPROTO, "ctnetlink answered GET without an IPv4 TCP entry")

    def delete(self, key: FlowKey) -> bool:
        """Forget the flow (its next packet is a stranger to conntrack); False when there is no such flow."""
        try:
            self._request(IPCTNL_MSG_CT_DELETE, NLM_F_ACK, _tuple(key))
        except FileNotFoundError:
            return False
        return True

    def dump(self) -> list[CtEvent]:
        """Every IPv4 TCP entry of this netns now (``destroyed=False``)."""
        entries = (_entry(payload, destroyed=False) for payload in self._request(IPCTNL_MSG_CT_GET, NLM_F_DUMP))
        return [entry for entry in entries if entry is not None]

    def flush(self) -> None:
        """Delete every IPv4 entry of this netns (each one a DESTROY event, with its counters)."""
        self._request(IPCTNL_MSG_CT_DELETE, NLM_F_ACK)

    def close(self) -> None:
        self._closed = True
        self._request_sock.close()  # closing a closed socket is a no-op
        if self._event_sock is not None:
            self._event_sock.close()

    def __enter__(self) -> Conntrack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _events(self) -> socket.socket:
        if self._closed:
            raise ValueError("Conntrack is closed")
        if self._event_sock is None:
            raise RuntimeError("Conntrack was opened without events=True")
        return self._event_sock

    def _request(self, msg: int, flags: int, attrs: bytes = b"") -> list[bytes]:
        """Send one request and return the payloads answered before its ACK or NLMSG_DONE.

        :raises OSError: the kernel's error (``FileNotFoundError`` for ``ENOENT``), or ``TimeoutError``.
        """
        if self._closed:
            raise ValueError("Conntrack is closed")
        self._seq = seq = (self._seq + 1) & 0xFFFFFFFF
        body = _NFGEN.pack(socket.AF_INET, 0, 0) + attrs
        header = NLMSG.pack(NLMSG.size + len(body), NFNL_SUBSYS_CTNETLINK << 8 | msg, NLM_F_REQUEST | flags, seq, 0)
        self._request_sock.send(header + body)
        answers: list[bytes] = []
        while True:
            for kind, got, payload in messages(self._request_sock.recv(RECV_SIZE)):
                if got != seq:  # a late answer to an earlier request that timed out
                    continue
                if kind in (NLMSG_ERROR, NLMSG_DONE):
                    code = -struct.unpack_from("=i", payload)[0] if len(payload) >= 4 else 0
                    if code > 0:
                        raise OSError(code, f"ctnetlink: {os.strerror(code)}")
                    return answers
                answers.append(payload)


__all__ = ["TCP_CLOSING_STATES", "Conntrack", "CtEvent", "FlowKey"]
