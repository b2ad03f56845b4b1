"""The guest agent's ``inspect_net`` op, on a fake /proc and /sys."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cryobox.guest.agent import GuestAgent
from cryobox.guest.ops_inspect import (
    InspectSources,
    NetInspector,
    decode_address,
    parse_arp,
    parse_ip_addr_json,
    parse_socket_table,
)

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0
   1: 0200A8C0:C350 0100A8C0:01BB 01 00000000:00000000 02:000A7B2C 00000000  1000        0 23456 2 0000000000000000 20 4 30 10 -1
   2: 020010AC:9C40 010010AC:0050 06 00000000:00000000 03:00000F6A 00000000     0        0 0 3 0000000000000000
   3: garbage line
"""  # noqa: E501 (real /proc lines)

TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3456 1 0000000000000000 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000200007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4567 1 0000000000000000 20 4 0 10 -1
   2: 000080FE000000000000000001000000:0222 000080FE000000000000000002000000:0223 0C 00000000:00000000 00:00000000 00000000     0        0 0 1 0000000000000000
"""  # noqa: E501

UDP = """\
   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  100: 00000000:0044 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 999 2 0000000000000000 0
  101: 020010AC:A000 010010AC:0035 01 00000000:00000000 00:00000000 00000000     0        0 998 2 0000000000000000 0
"""

ARP = """\
IP address       HW type     Flags       HW address            Mask     Device
172.16.0.1       0x1         0x2         02:CB:00:00:00:01     *        eth0
172.16.0.9       0x1         0x0         00:00:00:00:00:00     *        eth0
10.0.0.7         0x1         0x6         aa:bb:cc:dd:ee:ff     *        eth1
"""

IP_ADDR_JSON = json.dumps(
    [
        {"ifindex": 1, "ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
        {
            "ifindex": 2,
            "ifname": "eth0",
            "address": "02:cb:00:00:00:02",
            "addr_info": [
                {"family": "inet", "local": "172.16.0.2", "prefixlen": 30, "scope": "global"},
                {"family": "inet6", "local": "fe80::cb:ff:fe00:2", "prefixlen": 64, "scope": "link"},
            ],
        },
        {"ifindex": 3, "ifname": "dummy0", "addr_info": []},
    ]
)


@pytest.fixture
def sources(tmp_path: Path) -> InspectSources:
    proc, sys_root = tmp_path / "proc", tmp_path / "sys"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text(TCP)
    (proc / "net" / "tcp6").write_text(TCP6)
    (proc / "net" / "udp").write_text(UDP)
    # no udp6: a missing table is skipped
    (proc / "net" / "arp").write_text(ARP)
    for name, mac in [("lo", "00:00:00:00:00:00"), ("eth0", "02:cb:00:00:00:02")]:
        (sys_root / "class" / "net" / name).mkdir(parents=True)
        (sys_root / "class" / "net" / name / "address").write_text(mac + "\n")
    (tmp_path / "resolv.conf").write_text("nameserver 172.16.0.1\n")
    (tmp_path / "instance-id").write_text("sbx-42\n")
    return InspectSources(
        proc_root=str(proc),
        sys_root=str(sys_root),
        resolv_conf=str(tmp_path / "resolv.conf"),
        instance_id_path=str(tmp_path / "instance-id"),
        ip_command=None,
    )


def test_decode_address() -> None:
    assert decode_address("0100007F:0016") == "127.0.0.1:22"
    assert decode_address("0200A8C0:C350") == "192.168.0.2:50000"
    assert decode_address("00000000:0000") == "0.0.0.0:0"
    assert decode_address("00000000000000000000000001000000:0016") == "[::1]:22"
    assert decode_address("0000000000000000FFFF00000100007F:1F90") == "[::ffff:127.0.0.1]:8080"
    assert decode_address("000080FE000000000000000001000000:0222") == "[fe80::1]:546"
    assert decode_address("B80D0120000000000000000001000000:01BB") == "[2001:db8::1]:443"
    for bad in ["0100007F", "01007F:0016", "zz00007F:0016"]:
        with pytest.raises(ValueError):
            decode_address(bad)


def test_parse_tcp_tables() -> None:
    assert parse_socket_table("tcp", TCP) == [
        {"proto": "tcp", "local": "127.0.0.1:22", "remote": "0.0.0.0:0", "state": "LISTEN"},
        {"proto": "tcp", "local": "192.168.0.2:50000", "remote": "192.168.0.1:443", "state": "ESTABLISHED"},
        {"proto": "tcp", "local": "172.16.0.2:40000", "remote": "172.16.0.1:80", "state": "TIME_WAIT"},
    ]
    assert parse_socket_table("tcp6", TCP6) == [
        {"proto": "tcp6", "local": "[::1]:22", "remote": "[::]:0", "state": "LISTEN"},
        {
            "proto": "tcp6",
            "local": "[::ffff:127.0.0.1]:8080",
            "remote": "[::ffff:127.0.0.2]:54321",
            "state": "ESTABLISHED",
        },
        {"proto": "tcp6", "local": "[fe80::1]:546", "remote": "[fe80::2]:547", "state": "NEW_SYN_RECV"},
    ]


def test_parse_udp_table() -> None:
    assert parse_socket_table("udp", UDP) == [
        {"proto": "udp", "local": "0.0.0.0:68", "remote": "0.0.0.0:0", "state": "UNCONN"},
        {"proto": "udp", "local": "172.16.0.2:40960", "remote": "172.16.0.1:53", "state": "ESTABLISHED"},
    ]


def test_parse_arp() -> None:
    assert parse_arp(ARP) == [
        {"ip": "172.16.0.1", "mac": "02:cb:00:00:00:01", "device": "eth0", "flags": 2},
        {"ip": "172.16.0.9", "mac": "00:00:00:00:00:00", "device": "eth0", "flags": 0},
        {"ip": "10.0.0.7", "mac": "aa:bb:cc:dd:ee:ff", "device": "eth1", "flags": 6},
    ]
    assert parse_arp(ARP.splitlines()[0]) == []


def test_parse_ip_addr_json() -> None:
    assert parse_ip_addr_json(IP_ADDR_JSON) == {
        "lo": ["127.0.0.1/8"],
        "eth0": ["172.16.0.2/30", "fe80::cb:ff:fe00:2/64"],
        "dummy0": [],
    }
    assert parse_ip_addr_json("{}") == {}


def test_inspect_net_through_the_agent(sources: InspectSources) -> None:
    before = time.clock_gettime_ns(time.CLOCK_REALTIME)
    agent = GuestAgent(clock_setter=lambda ns: None, inspect_sources=sources)
    reply = agent.handle({"id": 3, "op": "inspect_net"})
    assert reply["ok"] is True, reply
    result = reply["result"]
    assert set(result) == {"sockets", "neighbours", "resolv_conf", "interfaces", "clock", "instance_id"}
    assert [s["proto"] for s in result["sockets"]] == ["tcp"] * 3 + ["tcp6"] * 3 + ["udp"] * 2
    assert result["neighbours"][0] == {"ip": "172.16.0.1", "mac": "02:cb:00:00:00:01", "device": "eth0", "flags": 2}
    assert result["resolv_conf"] == "nameserver 172.16.0.1\n"
    assert result["interfaces"] == [
        {"name": "eth0", "mac": "02:cb:00:00:00:02", "addresses": []},
        {"name": "lo", "mac": "00:00:00:00:00:00", "addresses": []},
    ]
    assert result["instance_id"] == "sbx-42"
    clock = result["clock"]
    assert before <= clock["realtime_ns"] <= time.clock_gettime_ns(time.CLOCK_REALTIME)
    assert 0 < clock["monotonic_ns"] <= clock["boottime_ns"]
    json.dumps(result)  # the reply must encode as a frame


def test_inspect_net_with_nothing_there(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    result = NetInspector(InspectSources(missing, missing, missing, missing, None)).inspect()
    assert result["sockets"] == [] and result["neighbours"] == [] and result["interfaces"] == []
    assert result["resolv_conf"] is None and result["instance_id"] is None


def test_inspect_addresses_from_a_fake_ip_command(sources: InspectSources, tmp_path: Path) -> None:
    fake_ip = tmp_path / "ip"
    (tmp_path / "ip.json").write_text(IP_ADDR_JSON)
    fake_ip.write_text(f'#!/bin/sh\n[ "$*" = "-j addr show" ] || exit 1\ncat {tmp_path / "ip.json"}\n')
    fake_ip.chmod(0o755)
    inspector = NetInspector(InspectSources(sources.proc_root, sources.sys_root, ip_command=str(fake_ip)))
    interfaces = inspector.interfaces()
    assert interfaces == [
        {"name": "eth0", "mac": "02:cb:00:00:00:02", "addresses": ["172.16.0.2/30", "fe80::cb:ff:fe00:2/64"]},
        {"name": "lo", "mac": "00:00:00:00:00:00", "addresses": ["127.0.0.1/8"]},
    ]
    broken = NetInspector(InspectSources(sources.proc_root, sources.sys_root, ip_command=str(tmp_path / "nope")))
    assert [i["addresses"] for i in broken.interfaces()] == [[], []]
