"""docs/metrics.md against what a running wrapper serves on its metrics port (issue 21, item 6): every family with
its type and labels, both ways; every label value there from the start; the latency histograms filled."""

from __future__ import annotations

import math
import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from federation.daemon import wrapper_events
from federation.daemon.metrics import ROAMING_KINDS
from federation.daemon.roaming_state import DROP_REASONS as ROAMING_DROP_REASONS
from federation.daemon.runtime import Runtime
from federation.envelope.datagrams import DROP_REASONS as ENVELOPE_REASONS
from federation.protocol import events, wire
from federation.protocol.types import Address

from broker_util import free_port, requires_mosquitto, start_broker, wait_for
from runtime_util import RuntimeThread, runtime_config

pytestmark = requires_mosquitto

REPO = Path(__file__).resolve().parents[2]


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    """metric as exposed -> (type, label names), from the table of docs/metrics.md"""
    found = {}
    for line in (REPO / "docs" / "metrics.md").read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| `((?:mqttfed|process)_[a-z0-9_]+)` \| (counter|gauge|histogram) \|([^|]*)\|", line)
        if match:
            found[match.group(1)] = (match.group(2), frozenset(re.findall(r"`([a-z_]+)`", match.group(3))))
    return found


def scrape(port: int) -> dict[str, tuple[str, frozenset[str], list[tuple[dict[str, str], float, str]]]]:
    """metric as exposed -> (type, label names, samples (labels, value, sample name))"""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    served = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" and not family.name.endswith("_total") \
            else family.name
        labels = frozenset(label for sample in family.samples for label in sample.labels if label != "le")
        served[name] = (family.type, labels, [(sample.labels, sample.value, sample.name) for sample in family.samples])
    return served


def values(served: dict, name: str, label: str) -> dict[str, float]:
    return {sample_labels[label]: value for sample_labels, value, _ in served[name][2]}


def test_the_endpoint_serves_exactly_the_documented_metrics_with_every_label_value(tmp_path: Path) -> None:
    broker = start_broker(tmp_path, name="broker")
    metrics_port = free_port()
    quiet = runtime_config(free_port())  # a neighbour without a broker: it answers hellos
    silent = Address("127.0.0.1", free_port())  # a configured neighbour nobody answers for
    config = runtime_config(broker.port, metrics_port=metrics_port, metrics_bind="127.0.0.1",
                            neighbours=(quiet.bind, silent))
    neighbour = RuntimeThread(Runtime(quiet))
    wrapper = RuntimeThread(Runtime(config))
    try:
        served = wait_for(lambda: (lambda s: s if s.get("mqttfed_ready", (0, 0, [({}, 0.0, "")]))[2][0][1] == 1.0
                                   else None)(scrape(metrics_port)), timeout=20, message="the wrapper to be ready")
        expected = documented()
        got = {name: (kind, labels) for name, (kind, labels, _) in served.items()}
        differ = sorted(name for name in set(got) | set(expected) if got.get(name) != expected.get(name))
        assert not differ, [(name, "served", got.get(name), "documented", expected.get(name)) for name in differ]
        # Every label value from the start, as 0 where nothing happened yet.
        assert set(values(served, "mqttfed_drops_total", "reason")) >= set(ENVELOPE_REASONS) | {"malformed",
                                                                                                "publication_no_route"}
        assert values(served, "mqttfed_drops_total", "reason")["publication_no_route"] == 0
        assert set(values(served, "mqttfed_packets_sent_total", "type")) == set(wire.MESSAGE_TYPES)
        assert values(served, "mqttfed_packets_received_total", "type")["tm"] == 0
        assert set(values(served, "mqttfed_events_total", "type")) == set(events.ALL) | set(wrapper_events.ALL)
        # What clients that move between brokers do and lose (issue 39), from the start.
        assert values(served, "mqttfed_roaming_total", "kind") == dict.fromkeys(ROAMING_KINDS, 0)
        assert set(values(served, "mqttfed_drops_total", "reason")) >= set(ROAMING_DROP_REASONS)
        assert values(served, "mqttfed_broker_connect_failures_total", "kind") == {"unreachable": 0, "refused": 0,
                                                                                  "tls": 0}
        up = values(served, "mqttfed_neighbour_up", "neighbour")
        assert up == {str(quiet.bind): 1.0, str(silent): 0.0}
        rtt = values(served, "mqttfed_neighbour_rtt_seconds", "neighbour")
        assert 0 < rtt[str(quiet.bind)] < 1 and math.isnan(rtt[str(silent)])
        hop_counts = {labels["neighbour"]: value for labels, value, name in served["mqttfed_hop_rtt_seconds"][2]
                      if name.endswith("_count")}
        assert hop_counts[str(quiet.bind)] >= 1 and hop_counts[str(silent)] == 0
        latency = {name: value for _labels, value, name in served["mqttfed_injection_latency_seconds"][2]
                   if not name.endswith("_bucket")}
        assert latency == {"mqttfed_injection_latency_seconds_count": 0.0,
                           "mqttfed_injection_latency_seconds_sum": 0.0}
        assert served["process_resident_memory_bytes"][2][0][1] > 10_000_000
        assert served["mqttfed_info"][2][0][0]["address"] == str(config.announced)
    finally:
        assert wrapper.stop() == 0
        assert neighbour.stop() == 0
        broker.stop()
