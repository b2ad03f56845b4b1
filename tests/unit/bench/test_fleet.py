"""``cryobox bench fleet``'s pure parts: result shape, percentiles, per-agent aggregation, namespace addresses and
names, moto's port line, relayed ports. No processes, no VMs, no namespaces."""

from __future__ import annotations

import ipaddress
from typing import Any

import httpx
import pytest

from cryobox.bench import fleet_result as fleet
from cryobox.bench import fleetproc
from cryobox.bench.fleet_result import (
    assemble,
    burst_summary,
    figures_delta,
    hop_summary,
    host_to_agent,
    memserver_figures,
    missing_keys,
    parse_metrics,
    per_agent_counts,
    restore_summary,
)
from cryobox.bench.fleetproc import (
    agents_by_name,
    fleet_addresses,
    guard_ruleset,
    link_names,
    loopback_ports,
    netns_name,
    parse_moto_endpoint,
    parse_netns_name,
    pick_fleet_index,
    s3_store_url,
    slot_cidrs,
)
from cryobox.bench.hop import Side, step_ms, turns
from cryobox.bench.stats import permutation_p


def _hop() -> dict[str, Any]:
    inproc = {"create_ms": [10.0, 30.0, 20.0, 40.0], "first_exec_ms": [15.0, 35.0, 25.0, 45.0], "exec_ms": [1.0, 3.0]}
    http = {"create_ms": [14.0, 34.0, 24.0, 90.0], "first_exec_ms": [20.0, 41.0, 30.0, 99.0], "exec_ms": [2.0, 6.0]}
    inproc["create_agent_ms"], http["create_agent_ms"] = [8.0, 9.0, 7.0], [9.5, 10.0, 8.0]
    return hop_summary(inproc, http)


def test_hop_has_every_promised_key_with_nearest_rank_percentiles() -> None:
    hop = _hop()
    assert set(fleet.HOP_KEYS) <= set(hop)
    assert (hop["create_p50_ms_inproc"], hop["create_p99_ms_inproc"]) == (20.0, 40.0)
    assert (hop["create_p50_ms_http"], hop["create_p99_ms_http"]) == (24.0, 90.0)
    assert (hop["exec_p50_ms_inproc"], hop["exec_p50_ms_http"]) == (1.0, 2.0)
    assert (hop["exec_p99_ms_inproc"], hop["exec_p99_ms_http"]) == (3.0, 6.0)
    assert hop["create_hop_p50_ms"] == 4.0 and hop["exec_hop_p50_ms"] == 1.0
    assert hop["k"] == 4
    assert hop["samples_ms"]["http"]["exec_ms"] == [2.0, 6.0]
    assert (hop["create_agent_p50_ms_inproc"], hop["create_agent_p50_ms_http"]) == (8.0, 9.5)
    assert hop["create_agent_hop_p50_ms"] == 1.5 and hop["exec_agent_hop_p50_ms"] is None  # no agent steps given


def test_server_timing_steps() -> None:
    answer = httpx.Response(200, headers={"Server-Timing": "control;dur=3.25, agent;dur=12.5,guest;dur=x"})
    assert step_ms(answer, "agent") == 12.5 and step_ms(answer, "control") == 3.25
    assert step_ms(answer, "guest") is None and step_ms(answer, "restore") is None
    assert step_ms(httpx.Response(200), "agent") is None


def test_hop_without_samples_reports_none_not_a_crash() -> None:
    hop = hop_summary({}, {"create_ms": [5.0]})
    assert hop["create_p50_ms_inproc"] is None and hop["create_p50_ms_http"] == 5.0
    assert hop["create_hop_p50_ms"] is None


def test_host_field_maps_to_agent_names_by_name_url_or_host_port() -> None:
    agents = {"a0": {"url": "http://10.250.1.2:7480"}, "a1": {"url": "http://10.250.2.2:7480/"}}
    assert host_to_agent("a1", agents) == "a1"
    assert host_to_agent("http://10.250.1.2:7480", agents) == "a0"
    assert host_to_agent("10.250.2.2:7480", agents) == "a1"
    assert host_to_agent("elsewhere", agents) == "elsewhere"
    assert host_to_agent(None, agents) == "?" and host_to_agent("", agents) == "?"


def test_per_agent_counts_keep_idle_agents_and_unknown_hosts() -> None:
    assert per_agent_counts(["a0", "a2", "a0", "x"], ["a0", "a1", "a2"]) == {"a0": 2, "a1": 0, "a2": 1, "x": 1}


def test_memserver_figures_sum_stored_chunks_over_images() -> None:
    stats = {
        "metrics": {"store_gets": 41, "faults": 900, "chunk_fetches": 40},
        "images": {"templates+base+g1": {"touched": 50, "touched_stored": 38}, "snap": {"touched_stored": 2}},
    }
    assert memserver_figures(stats) == {"store_gets": 41, "unique_chunks": 40, "faults": 900, "chunk_fetches": 40}
    assert memserver_figures({}) == {"store_gets": 0, "unique_chunks": 0, "faults": 0, "chunk_fetches": 0}


def test_figures_delta_subtracts_counters_but_not_the_set_size() -> None:
    before = {"store_gets": 5, "unique_chunks": 3, "faults": 10, "chunk_fetches": 4}
    after = {"store_gets": 45, "unique_chunks": 40, "faults": 910, "chunk_fetches": 44}
    assert figures_delta(before, after) == {"store_gets": 40, "unique_chunks": 40, "faults": 900, "chunk_fetches": 40}


def test_parse_metrics_sums_labelled_series_and_skips_comments() -> None:
    text = (
        "# HELP store_gets_total GET attempts\n# TYPE store_gets_total counter\nstore_gets_total 12.0\n"
        'chunk_fetch_seconds_bucket{le="0.1"} 3\nchunk_fetch_seconds_bucket{le="+Inf"} 4\nfaults_total 7\n'
        "garbage line\n"
    )
    metrics = parse_metrics(text)
    assert metrics["store_gets_total"] == 12.0 and metrics["faults_total"] == 7.0
    assert metrics["chunk_fetch_seconds_bucket"] == 7.0


def test_burst_summary_shape() -> None:
    figures = {"a0": {"store_gets": 30, "unique_chunks": 28}, "a1": {"store_gets": 31, "unique_chunks": 28}}
    burst = burst_summary(4, [100.0, 400.0, 200.0, 300.0], ["a0", "a1", "a0", "a0"], ["a0", "a1", "a2"], figures)
    assert set(fleet.BURST_KEYS) <= set(burst)
    assert burst["per_agent"] == {"a0": 3, "a1": 1, "a2": 0}
    assert burst["store_gets_per_agent"] == {"a0": 30, "a1": 31, "a2": None}
    assert burst["unique_chunks_per_agent"] == {"a0": 28, "a1": 28, "a2": None}
    assert (burst["p50_ms"], burst["p99_ms"], burst["max_ms"]) == (200.0, 400.0, 400.0)
    assert burst["latencies_ms"] == [100.0, 200.0, 300.0, 400.0]
    assert burst["ok"] == 4 and burst["errors"] == 0


def test_burst_summary_counts_errors_and_survives_no_success() -> None:
    burst = burst_summary(2, [], [], ["a0"], {}, errors=["boom", "bang"])
    assert burst["ok"] == 0 and burst["errors"] == 2 and burst["first_errors"] == ["boom", "bang"]
    assert burst["p50_ms"] is None and burst["max_ms"] is None and burst["per_agent"] == {"a0": 0}


def test_restores_are_same_host_cross_host_or_repeat() -> None:
    samples = [
        {"host": "a0", "ms": 900.0, "ok": True, "snapshot": 0},
        {"host": "a1", "ms": 2000.0, "ok": True, "snapshot": 0},
        {"host": "a1", "ms": 400.0, "ok": True, "snapshot": 0},  # a1 holds snapshot 0 now
        {"host": "a1", "ms": 3000.0, "ok": True, "snapshot": 1},  # but not snapshot 1
        {"host": "a2", "ms": 50.0, "ok": False, "snapshot": 1},  # failed: no latency, and a2 still lacks it
        {"host": "a2", "ms": 2500.0, "ok": True, "snapshot": 1},
        {"host": "a0", "ms": 5.0, "ok": False, "snapshot": 0},
    ]
    summary = restore_summary(samples, "a0")
    same, cross, repeat = "same-host", "cross-host", "cross-host-repeat"
    assert [s["kind"] for s in summary["samples"]] == [same, cross, repeat, cross, cross, cross, same]
    assert (summary["same_host"], summary["cross_host"], summary["cross_host_repeat"]) == (2, 4, 1)
    assert summary["same_host_restore_p50_ms"] == 900.0
    assert summary["cross_host_restore_p50_ms"] == 2500.0  # of 2000, 2500, 3000 (the failed one has no latency)
    assert summary["cross_host_repeat_p50_ms"] == 400.0
    assert summary["cross_host_restore_ok"] is False  # one restore away from the source failed


def test_cross_host_ok_needs_a_first_time_restore_elsewhere_and_every_one_good() -> None:
    assert restore_summary([{"host": "a0", "ms": 1.0, "ok": True}], "a0")["cross_host_restore_ok"] is False
    good = [{"host": "a1", "ms": 1.0, "ok": True}, {"host": "a2", "ms": 3.0, "ok": True}]
    assert restore_summary(good, "a0")["cross_host_restore_ok"] is True
    assert restore_summary(good, "a0")["cross_host_restore_p50_ms"] == 1.0
    none = restore_summary([], "a0")
    assert none["same_host_restore_p50_ms"] is None and none["cross_host_restore_p50_ms"] is None
    assert none["cross_host_restore_ok"] is False


def test_assembled_result_has_every_promised_key() -> None:
    burst = burst_summary(1, [1.0], ["a0"], ["a0"], {"a0": {"store_gets": 1, "unique_chunks": 1}})
    restore = restore_summary([{"host": "a1", "ms": 2.0, "ok": True, "snapshot": 0}], "a0")
    result = assemble(_hop(), burst, restore, template="base")
    assert missing_keys(result) == []
    assert result["cross_host_restore_ok"] is True and result["cross_host_restore_p50_ms"] == 2.0
    assert result["same_host_restore_p50_ms"] is None and result["template"] == "base"
    del result["hop"]["exec_p99_ms_http"], result["burst"]["per_agent"], result["same_host_restore_p50_ms"]
    assert missing_keys(result) == ["same_host_restore_p50_ms", "hop.exec_p99_ms_http", "burst.per_agent"]


# -- fleetproc --------------------------------------------------------------------------------------------------------


def test_fleet_addresses_are_the_ends_of_a_slash_30() -> None:
    a = fleet_addresses(7)
    assert (a.root_ip, a.agent_ip, str(a.network), a.prefixlen) == ("10.250.7.1", "10.250.7.2", "10.250.7.0/30", 30)
    assert ipaddress.ip_address(a.root_ip) in a.network and ipaddress.ip_address(a.agent_ip) in a.network
    assert fleet_addresses(254).agent_ip == "10.250.254.2"
    for bad in (0, 255, -1):
        with pytest.raises(ValueError):
            fleet_addresses(bad)


def test_pick_fleet_index_skips_used_blocks_but_not_for_a_default_route() -> None:
    net = ipaddress.IPv4Network
    assert pick_fleet_index([]) == 1
    assert pick_fleet_index([net("0.0.0.0/0"), net("192.0.2.0/24")]) == 1
    assert pick_fleet_index([net("10.250.1.0/30"), net("10.250.2.1/32")]) == 3
    assert pick_fleet_index([net("10.250.1.0/30")], exclude={2, 3}) == 4
    with pytest.raises(RuntimeError):
        pick_fleet_index([net("10.250.0.0/16")])


def test_namespace_and_link_names_fit_and_round_trip() -> None:
    name = netns_name("a0", "0a1b2c")
    assert name == "cbxfleet-a0-0a1b2c"
    assert parse_netns_name(name) == ("a0", "0a1b2c")
    assert parse_netns_name("cbxfleet-long-name-1-abcdef") == ("long-name-1", "abcdef")
    assert parse_netns_name("cryobox-0a1b2c-3") is None and parse_netns_name("cbxfleet-a0-XYZ") is None
    root, agent = link_names("0a1b2c")
    assert (root, agent) == ("fl0a1b2cr", "fl0a1b2ca")
    assert len(root) <= 15 and not root.startswith("cb")  # agents treat cb* links as their sandboxes' slots
    for bad in ("", "A0", "a_0", "-a", "x" * 21):
        with pytest.raises(ValueError):
            netns_name(bad, "0a1b2c")


def test_guard_ruleset_drops_forwarding_both_ways_and_is_reloadable() -> None:
    rules = guard_ruleset("cbxfleet_0a1b2c", "fl0a1b2cr")
    assert rules.startswith("add table inet cbxfleet_0a1b2c\ndelete table inet cbxfleet_0a1b2c\n")
    assert 'iifname "fl0a1b2cr" drop' in rules and 'oifname "fl0a1b2cr" drop' in rules
    assert "hook forward" in rules and "masquerade" not in rules and "accept\n" not in rules.split("policy")[1]


def test_moto_endpoint_is_read_from_werkzeugs_line() -> None:
    log = (
        " * Serving Flask app 'moto.backend_index'\nWARNING: This is a development server.\n"
        " * Running on http://127.0.0.1:38083\nPress CTRL+C to quit\n"
    )
    assert parse_moto_endpoint(log) == "http://127.0.0.1:38083"
    assert parse_moto_endpoint(" * Running on all addresses (0.0.0.0)\n * Running on http://127.0.0.1:5\n") == (
        "http://127.0.0.1:5"
    )
    assert parse_moto_endpoint(" * Running on http://192.0.2.2:5\n") is None
    assert parse_moto_endpoint(" * Running on http://10.250.1.1:9\n", host="10.250.1.1") == "http://10.250.1.1:9"
    assert parse_moto_endpoint("starting...") is None


def test_loopback_ports_are_what_a_namespaced_agent_needs_relayed() -> None:
    store = s3_store_url("b", "http://127.0.0.1:38083")
    assert store == "s3://b?endpoint=http://127.0.0.1:38083&region=us-east-1"
    assert loopback_ports(["http://127.0.0.1:8080", store, "http://127.0.0.1:8080/"]) == [8080, 38083]
    assert loopback_ports(["http://localhost", "file:///var/cache/store", "s3://b?region=x", ""]) == [80]
    assert loopback_ports(["http://10.250.1.1:8080", "s3://b?endpoint=https://s3.example:443"]) == []


def test_slot_cidrs_are_distinct_and_avoid_taken_and_fleet_networks() -> None:
    cidrs = slot_cidrs(3, [ipaddress.IPv4Network("10.200.0.0/16"), ipaddress.IPv4Network("10.202.5.0/24")])
    assert cidrs == ["10.201.0.0/16", "10.203.0.0/16", "10.204.0.0/16"]
    assert all(not ipaddress.IPv4Network(c).overlaps(fleetproc.FLEET_NET) for c in slot_cidrs(50))


def test_agents_by_name() -> None:
    payload = {"agents": [{"name": "a0", "status": "up"}, {"name": "a1", "status": "down"}, {"url": "x"}, "junk"]}
    assert agents_by_name(payload) == {"a0": {"name": "a0", "status": "up"}, "a1": {"name": "a1", "status": "down"}}
    assert agents_by_name({}) == {}


def test_the_hop_says_whether_its_difference_is_real() -> None:
    same = [10.0 + (i % 7) for i in range(40)]
    shifted = [x + 5.0 for x in same]
    hop = hop_summary({"create_ms": same, "exec_ms": same}, {"create_ms": shifted, "exec_ms": list(reversed(same))})
    assert hop["create_hop_p50_ms"] == 5.0 and hop["create_hop_p_value"] < 0.01 and hop["create_hop_significant"]
    assert hop["exec_hop_p50_ms"] == 0.0 and hop["exec_hop_p_value"] > 0.5 and not hop["exec_hop_significant"]
    assert hop["first_exec_hop_p_value"] is None and not hop["first_exec_hop_significant"]  # no samples


def test_permutation_p_is_seeded_and_small_only_for_a_real_shift() -> None:
    noise = [100.0, 130.0, 90.0, 150.0, 110.0, 95.0, 170.0, 105.0]
    assert permutation_p(noise, noise[::-1], rounds=2000) == permutation_p(noise, noise[::-1], rounds=2000)
    assert (permutation_p(noise, noise[::-1], rounds=2000) or 0) > 0.5  # the same samples relabelled: no difference
    assert (permutation_p(noise, [x + 200 for x in noise], rounds=2000) or 1) < 0.01
    assert permutation_p([], noise) is None


def test_sides_take_turns_first() -> None:
    a, b = Side("inproc", "http://a", "k"), Side("http", "http://b", "k")
    assert [[s.name for s in turns(i, [a, b])] for i in range(4)] == [
        ["inproc", "http"],
        ["http", "inproc"],
        ["inproc", "http"],
        ["http", "inproc"],
    ]
