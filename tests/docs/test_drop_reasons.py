"""docs/drops.md against the code: every reason a wrapper counts, and the events that report them.

Where the reasons come from: the envelope declares its own (`DATAGRAM_REASONS`, `MESSAGE_REASONS`); the
node's and the daemon's are string literals where they are counted, collected from the source
(tests/docs/source_scan.py, `Source.drop_reasons`). Once the code declares every reason in one
registry, read that here instead of scanning.
"""

from __future__ import annotations

from functools import cache

from doc_tables import backticked, table
from source_scan import Source

from federation.envelope.datagrams import DATAGRAM_REASONS, MESSAGE_REASONS

DOC = "drops.md"
COUNTED_IN = ["federation/protocol", "federation/envelope", "federation/daemon"]


@cache
def rows() -> dict[str, dict[str, str]]:
    found = {}
    for row in table(DOC, "Drop reasons"):
        (reason,) = backticked(row["reason"])
        assert reason not in found, f"docs/drops.md lists {reason} twice"
        found[reason] = row
    return found


def reported_as(event: str) -> dict[str, str | None]:
    """drop reason -> the event reason it is reported with (None for `packet_dropped`, which has none)."""
    reported = {}
    for reason, row in rows().items():
        named = backticked(row["reported as"])
        if named and named[0] == event:
            reported[reason] = named[1] if len(named) > 1 else None
    return reported


@cache
def source() -> Source:
    return Source(COUNTED_IN)


@cache
def whole_source() -> Source:
    return Source(["federation"])


def code_reasons() -> set[str]:
    return set(source().drop_reasons()) | set(DATAGRAM_REASONS) | set(MESSAGE_REASONS)


def test_every_reason_counted_is_documented_and_every_documented_reason_is_counted() -> None:
    counted, documented = code_reasons(), set(rows())
    assert counted == documented, (f"counted but not in docs/drops.md: {sorted(counted - documented)}; "
                                   f"in docs/drops.md but never counted: {sorted(documented - counted)}")


def test_each_row_says_which_part_counts_it() -> None:
    parts = {reason: row["counted by"] for reason, row in rows().items()}
    assert set(parts.values()) <= {"node", "envelope", "daemon"}, parts
    envelope = set(DATAGRAM_REASONS) | set(MESSAGE_REASONS)
    assert {reason for reason, part in parts.items() if part == "envelope"} >= envelope


def test_the_packets_refused_are_reported_as_packet_dropped() -> None:
    """What the code reports as `packet_dropped` (decoding errors, the envelope's refusals, the node's own)
    is what docs/drops.md says is reported so."""
    decoding = source().first_arguments("DecodeError")  # the node reports these under the error's reason
    reported = whole_source().event_values("packet_dropped", "reason")
    code = reported | decoding | set(DATAGRAM_REASONS) | set(MESSAGE_REASONS)
    assert set(reported_as("packet_dropped")) == code


def test_the_publication_drops_match_the_publication_dropped_reasons() -> None:
    documented = reported_as("publication_dropped")
    assert all(documented.values()), f"give the publication_dropped reason: {documented}"
    assert set(documented.values()) == whole_source().event_values("publication_dropped", "reason")


def test_the_protocol_spec_names_no_reason_the_table_lacks() -> None:
    """docs/protocol.md keeps the exact decoding and envelope checks (their order is the spec); their reasons
    must be the ones docs/drops.md lists."""
    named = {reason for heading in ("Strict decoding", "Receiving")
             for row in table("protocol.md", heading) for reason in backticked(row["reason"])}
    assert named <= set(rows()), f"docs/protocol.md names reasons docs/drops.md lacks: {sorted(named - set(rows()))}"


def test_the_metrics_export_every_reason_from_the_start() -> None:
    """`mqttfed_drops_total` has a sample for every reason from the start (0 until counted): its list is the code's."""
    from federation.daemon.metrics import DROP_REASONS

    listed = set(DROP_REASONS)
    assert len(listed) == len(DROP_REASONS), "federation/daemon/metrics.py lists a drop reason twice"
    counted = code_reasons()
    assert listed == counted, (f"counted but not in metrics.NODE_DROP_REASONS: {sorted(counted - listed)}; "
                               f"listed but never counted: {sorted(listed - counted)}")
