"""Do the wrappers' counters and events agree with what the subscribers received? One case's ledger.

Theory of operation: issue 37 asks for honest counters: every publication
that does not reach a broker that subscribed to it ends with a drop reason
and a `publication_dropped` event, and `custody_released` counts only the
publications every subscribing broker has. The subscribers' files say what
arrived (`counting`); the wrappers' event logs and status say what they
think happened. The ledger puts them side by side, per stream, and lists
every disagreement (`problems`); a case meets the target only with none:

- **Delivered against received.** At every subscribing node, the wrapper's
  `publication_delivered` events for the stream's topic name at least as
  many distinct publications as the subscriber printed (the broker gives its
  client what the wrapper injected; a broker killed without persistence can
  lose some, never invent them). Not at a node whose wrapper was killed
  with SIGKILL during the case (`killed`): the events it had not written
  yet died with it (a soak's kill of the subscriber's wrapper: 164 of
  360,000).
- **No silent loss.** A stream that lost publications at a node (acknowledged
  to the publisher, never printed there) has at least as many of its
  publications reported in `publication_dropped` events (any node, any
  reason) as it lost there.
- **Custody conservation at the origin.** Over the case, the origin's
  `custody_released` plus `custody_given_up` plus what is still in its
  custody equals the QoS 1/2 publications it originated (every stream is
  QoS 1 or 2), and nothing was given up when no subscriber lost anything.
  The counters of a wrapper that restarted during the case began again, so
  that check is left out for a publisher-side wrapper that restarted (said
  in `origin.checked`).

Pure: events, snapshots and counts in, a JSON-able document out
(tests/tools/test_faults_units.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from suites.faults.counting import StreamCount


def _distinct(events: list[dict[str, Any]], kind: str, topic: str) -> set[str]:
    return {str(event.get("pub")) for event in events if event.get("type") == kind and event.get("topic") == topic}


def ledger(events: Mapping[str, list[dict[str, Any]]], topics: Mapping[str, str], publisher: str,
           counts: Mapping[str, Mapping[str, StreamCount]], before: Mapping[str, Any],
           after: Mapping[str, Any], killed: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The case's ledger. `topics`: stream label -> topic; `counts`: node -> stream label -> what its subscriber
    received; `before`, `after`: the setup's snapshots (`FederationSetup.snapshot`) around the case; `killed`: the
    nodes whose wrapper was killed with SIGKILL during it."""
    problems: list[str] = []
    origin_events = events.get(publisher, [])
    dropped_pubs = {str(event.get("pub")) for node_events in events.values() for event in node_events
                    if event.get("type") == "publication_dropped"}
    streams: dict[str, Any] = {}
    lost_anywhere = 0
    for label, topic in sorted(topics.items()):
        originated = _distinct(origin_events, "publication_originated", topic)
        dropped = originated & dropped_pubs
        nodes: dict[str, Any] = {}
        for node, by_label in sorted(counts.items()):
            count = by_label.get(label)
            if count is None:
                continue
            delivered = _distinct(events.get(node, []), "publication_delivered", topic)
            received = count.received - count.duplicated
            nodes[node] = {"delivered": len(delivered), "received": received, "lost": count.lost}
            lost_anywhere += count.lost
            if node in killed:
                nodes[node]["checked"] = "lost only: its wrapper was killed, with the events it had not written"
            elif len(delivered) < received:
                problems.append(f"{label} at {node}: the subscriber received {received} distinct publications, "
                                f"the wrapper reported delivering {len(delivered)}")
            if count.lost > len(dropped):
                problems.append(f"{label} at {node}: {count.lost} publications lost there, {len(dropped)} of the "
                                f"stream reported dropped (a loss without a drop reason and event)")
        streams[label] = {"originated": len(originated), "dropped": len(dropped), "nodes": nodes}
    origin: dict[str, Any] = {}
    first, last = before.get(publisher), after.get(publisher)
    if not first or not last:
        origin["checked"] = "no: the publisher-side wrapper did not answer status before and after the case"
    elif first.get("pid") != last.get("pid"):
        origin["checked"] = "no: the publisher-side wrapper restarted during the case (its counters began again)"
    else:
        def delta(name: str) -> int:
            return int(last["counters"].get(name, 0)) - int(first["counters"].get(name, 0))

        def still(snapshot: Mapping[str, Any]) -> int:
            return int(snapshot.get("custody", {}).get("own_open", 0))

        originated_count = delta("publications_originated")
        released, given_up = delta("custody_released"), delta("custody_given_up")
        open_before, open_after = still(first), still(last)
        origin = {"checked": "yes", "originated": originated_count, "released": released, "given_up": given_up,
                  "in_custody_before": open_before, "in_custody_after": open_after}
        if released + given_up + open_after != originated_count + open_before:
            problems.append(f"origin: released {released} + given up {given_up} + still in custody {open_after} "
                            f"!= originated {originated_count} + in custody before {open_before}")
        if given_up and not lost_anywhere:
            problems.append(f"origin: {given_up} publications given up while every subscriber received everything")
    return {"streams": streams, "origin": origin, "problems": problems}
