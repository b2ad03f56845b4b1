"""The pure parts of ``cryobox bench net``'s egress section: the comparisons, the targets, the JSON keys (all new,
all ``egress_``-prefixed, so the bench net JSON keeps its existing keys) and the table."""

from __future__ import annotations

import ipaddress
import json

import pytest
from rich.console import Console

from cryobox.bench.egress import pick_rig
from cryobox.bench.egress_result import (
    EGRESS_NOTES,
    EgressSamples,
    build_egress_result,
    compare_latency,
    compare_throughput,
    egress_table,
)
from cryobox.bench.net_result import NOTES
from cryobox.bench.snapshot_report import BenchError


def _samples(*, proxied_mbps: list[float], in_process: bool = False) -> EgressSamples:
    s = EgressSamples(server_cidr="10.199.7.0/30", slot_cidr="10.233.0.0/16", bulk_bytes=3 * 2**30)
    s.connect_ms = {"direct": [0.2, 0.3, 0.25, 0.4], "proxied": [0.6, 0.7, 0.65, 1.9]}
    s.http_ms = {"direct": [0.3, 0.35], "proxied": [0.8, 0.9]}
    s.throughput_mbps = {"direct": [2000.0, 2200.0, 2100.0], "proxied": proxied_mbps}
    s.proxied_connections = 42
    if in_process:
        s.in_process_connect_ms = {"direct": [0.3], "proxied": [0.9]}
        s.in_process_throughput_mbps = {"direct": [1800.0], "proxied": [900.0]}
        s.in_process_bulk_bytes = 2**30
    return s


def test_latency_is_compared_at_the_percentile_with_the_delta_the_proxy_adds() -> None:
    got = compare_latency({"direct": [0.2, 0.3, 0.25, 0.4], "proxied": [0.6, 0.7, 0.65, 1.9]}, 50)
    assert got == {"direct": 0.25, "proxied": 0.65, "delta": 0.4}
    assert compare_latency({"direct": [0.2, 0.3, 0.25, 0.4], "proxied": [0.6, 0.7, 0.65, 1.9]}, 95)["proxied"] == 1.9


def test_throughput_ratios_of_the_best_and_of_the_medians() -> None:
    got = compare_throughput({"direct": [2000.0, 2200.0, 2100.0], "proxied": [1100.0, 1000.0, 1650.0]})
    assert (got["direct"], got["proxied"], got["ratio"]) == (2200.0, 1650.0, 0.75)
    assert (got["direct_median"], got["proxied_median"], got["ratio_median"]) == (2100.0, 1100.0, 0.524)
    assert got["runs"] == 3


def test_result_keys_are_new_and_carry_the_targets() -> None:
    result = build_egress_result(_samples(proxied_mbps=[1800.0, 1700.0, 1900.0]))
    assert all(key.startswith("egress_") for key in result)
    assert not set(result) & set(NOTES)  # never overwrites a key bench net already has
    assert result["egress_connect_p50_ms"]["delta"] == 0.4
    assert result["egress_throughput_mbps"]["ratio"] == round(1900 / 2200, 3)
    assert result["egress_targets"] == {
        "connect_delta_ms_max": 1.0,
        "connect_delta_met": True,
        "throughput_ratio_min": 0.8,
        "throughput_ratio_met": True,
    }
    assert result["egress_connect_ms"]["proxied"]["n"] == 4
    assert "egress_in_process" not in result
    assert {k for k in EGRESS_NOTES} <= set(result) | {"egress_client"}
    json.dumps(result)


def test_a_slow_relay_misses_the_throughput_target_and_in_process_figures_are_kept_apart() -> None:
    result = build_egress_result(_samples(proxied_mbps=[1100.0, 1000.0, 1150.0], in_process=True))
    assert result["egress_targets"]["throughput_ratio_met"] is False
    inproc = result["egress_in_process"]
    assert inproc["throughput_mbps"]["ratio"] == 0.5 and inproc["connect_p50_ms"]["delta"] == 0.6
    console = Console(record=True, width=160)
    console.print(egress_table(result))
    text = console.export_text()
    assert "MISSED" in text and "+0.400 ms" in text and "x0.52" in text and "42 connections" in text


def test_missing_samples_are_an_error() -> None:
    s = _samples(proxied_mbps=[1.0])
    s.http_ms = {"direct": [0.3]}
    with pytest.raises(BenchError, match="no HTTP samples for proxied"):
        build_egress_result(s)


def test_the_rig_avoids_host_routes() -> None:
    taken = [ipaddress.IPv4Network("10.199.0.0/17"), ipaddress.IPv4Network("10.230.0.0/15")]
    for _ in range(20):
        rig = pick_rig(taken, "abc123")
        assert rig.k >= 128 and rig.slot_cidr not in ("10.230.0.0/16", "10.231.0.0/16")
        assert rig.server_ip == f"10.199.{rig.k}.2" and str(rig.server_net) == f"10.199.{rig.k}.0/30"
        assert rig.server_ns == "cryobox-abc123-srv" and rig.links == ("xsabc123", "xdabc123")
    with pytest.raises(BenchError, match="no free"):
        pick_rig([ipaddress.IPv4Network("10.0.0.0/8")], "abc123")
