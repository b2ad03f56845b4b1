"""Parsing /proc/net/tcp{,6} for established connections."""

from __future__ import annotations

from cryobox.agent.templates.quiesce import TcpConnection, established_connections

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 16253 1 0000000000000000 100 0 0 10 0
   1: 0F02000A:0016 0202000A:C822 06 00000000:00000000 03:00000F2C 00000000     0        0 0 3 0000000000000000
   2: 0100007F:1F40 0100007F:B26E 01 00000000:00000000 00:00000000 00000000     0        0 16254 1 0000000000000000 20 4 30 10 -1
   3: 0F02000A:0016 0202000A:C822 01 00000000:00000000 02:00078A3C 00000000     0        0 16301 2 0000000000000000 20 4 31 10 -1
"""  # noqa: E501

TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 16400 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:1F90 00000000000000000000000001000000:D431 01 00000000:00000000 00:00000000 00000000     0        0 16401 1 0000000000000000 20 4 30 10 -1
"""  # noqa: E501


def test_ipv4_established_only() -> None:
    found = established_connections(TCP)
    assert found == [
        TcpConnection(local="127.0.0.1:8000", remote="127.0.0.1:45678"),
        TcpConnection(local="10.0.2.15:22", remote="10.0.2.2:51234"),
    ]


def test_ipv6_loopback() -> None:
    assert established_connections(TCP6) == [TcpConnection(local="[::1]:8080", remote="[::1]:54321")]


def test_concatenated_tcp_and_tcp6() -> None:
    found = established_connections(TCP + TCP6)
    assert [str(c) for c in found] == [
        "127.0.0.1:8000 -> 127.0.0.1:45678",
        "10.0.2.15:22 -> 10.0.2.2:51234",
        "[::1]:8080 -> [::1]:54321",
    ]


def test_nothing_established() -> None:
    listen_only = TCP.splitlines()[:2] + TCP6.splitlines()[:2]
    assert established_connections("\n".join(listen_only)) == []
    assert established_connections("") == []
