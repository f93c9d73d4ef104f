"""Neighbour liveness and loss accounting under overload, on the sans-I/O node (issue: false
neighbour-down when hellos wait behind data; publications lost without a report).

`LossyHarness` drops chosen packet types on chosen directed links, which is what a receiver
that is seconds behind on its data does to hellos from the sender's point of view.
"""

from __future__ import annotations

from collections import Counter

from federation.protocol import wire
from federation.protocol.events import publication_text
from federation.protocol.publication_events import expand_all
from federation.protocol.settings import Settings
from federation.protocol.types import Address

from node_harness import Harness, address


class LossyHarness(Harness):
    """A Harness that drops the packets of `drop_types` on the directed links in `lossy`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.lossy: set[tuple[int, int]] = set()
        self.drop_types: set[str] = set()
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def lose(self, data: bytes, source: Address, target: int) -> bool:
        return (int(source.host.rsplit(".", 1)[1]), target) in self.lossy and wire.packet_type(data) in self.drop_types


def downs(h: Harness, index: int) -> list[dict[str, object]]:
    return [e for e in h.events if e["type"] == "neighbour_down" and e["node"] == str(address(index))]


def publish_for(h: Harness, index: int, qos: int, until: float, step: float = 0.05) -> list[str]:
    published = []
    while h.now + step < until:
        h.run(h.now + step)
        publication = h.do(index, "local_publish", "t/x", b"payload", qos, False, None)
        published.append(publication_text(publication))  # type: ignore[arg-type]
    return published


def subscribed_pair(filter_1: str, filter_2: str, qos: int) -> LossyHarness:
    """Nodes 1 and 2 (hello interval 0.2 s), each with a local subscriber, converged, their link lossy."""
    h = LossyHarness([(1, 2)], settings=Settings(hello_interval=0.2))
    h.run(1.0)
    h.do(2, "local_subscribe", "c", filter_2, qos)
    h.do(1, "local_subscribe", "c", filter_1, qos)
    h.run(2.0)
    h.lossy = {(1, 2), (2, 1)}
    return h


def test_acknowledged_publications_keep_a_busy_neighbour_up_without_hellos() -> None:
    """Every hello and hello back lost (stuck behind data) for 10 dead intervals: the `ta` echoing our
    QoS 1 `tm` prove both directions, so node 1 keeps node 2 up and forwards everything."""
    h = subscribed_pair("t/#", "t/#", qos=1)
    h.drop_types = {wire.HELLO, wire.HELLO_BACK}
    published: dict[int, list[str]] = {1: [], 2: []}
    end = 2.0 + 10 * h.settings.neighbour_dead_after
    while h.now < end:  # both sides publish, as two busy brokers do
        for index in (1, 2):
            published[index] += publish_for(h, index, qos=1, until=h.now + 0.1)
    assert downs(h, 1) == [] and downs(h, 2) == []
    assert h.nodes[1].neighbours.get(address(2)).up  # type: ignore[union-attr]
    h.run(h.now + 0.5)
    for source, sink in ((1, 2), (2, 1)):
        delivered = {publication_text(i.publication) for n, i in h.delivered if n == sink}
        assert set(published[source]) <= delivered
    # Echoes keep a link up; they never bring one up, and without them it still goes down.
    h.run(h.now + 2 * h.settings.neighbour_dead_after)
    assert len(downs(h, 1)) == 1 and len(downs(h, 2)) == 1


def test_without_echoes_the_neighbour_still_goes_down() -> None:
    """QoS 0 `tm` (no `ta`) and `hl` from the neighbour prove only the inbound direction: not liveness."""
    h = subscribed_pair("u/#", "t/#", qos=0)
    h.drop_types = {wire.HELLO_BACK}  # hellos arrive both ways, and data from both sides
    start = h.now
    publish_for(h, 1, qos=0, until=start + 2 * h.settings.neighbour_dead_after)
    assert len(downs(h, 1)) == 1 and len(downs(h, 2)) == 1


def test_one_way_cut_under_acknowledged_traffic_takes_the_link_down_at_both_ends() -> None:
    """The `ta` rule does not weaken rule 1: cut 2 -> 1 while node 1 keeps sending QoS 1 `tm` to 2."""
    for cut in ((1, 2), (2, 1)):
        h = Harness([(1, 2)], settings=Settings(hello_interval=0.2))
        h.run(1.0)
        h.do(2, "local_subscribe", "c", "t/#", 1)
        h.do(1, "local_subscribe", "c", "t/#", 1)
        h.run(2.0)
        h.cut_link(*cut, oneway=True)
        publish_for(h, 1, qos=1, until=h.now + 2 * h.settings.neighbour_dead_after)
        publish_for(h, 2, qos=1, until=h.now + 0.5)
        assert len(downs(h, 1)) >= 1 and len(downs(h, 2)) >= 1, cut


def test_publications_while_the_core_is_lost_are_reported_not_silent() -> None:
    """The benchmark's silent loss: after the link to the core's side goes down the filter was forgotten
    and later publications matched nothing. Every QoS 0 publication is now forwarded or dropped with a
    reason; every QoS 1 one is held until the core is back, and then delivered."""
    for qos in (0, 1):
        h = Harness([(1, 2), (2, 3)])
        h.run(3.0)
        h.do(3, "local_subscribe", "c", "t/#", qos)
        h.run(8.0)
        h.cut_link(1, 2)
        published = publish_for(h, 1, qos=qos, until=20.0)
        h.run(40.0)
        mine = [e for e in expand_all(h.events) if e["node"] == str(address(1))]
        forwarded = {e["pub"] for e in mine if e["type"] == "publication_forwarded"}
        dropped = {e["pub"] for e in mine if e["type"] == "publication_dropped"}
        reasons = Counter(e["reason"] for e in mine if e["type"] == "publication_dropped")
        if qos == 0:
            assert set(published) - forwarded - dropped == set(), qos
            assert reasons["no_core"] > 0
            assert h.nodes[1].drops["publication_no_core"] == reasons["no_core"]
            continue
        # Held, those sent before the link was known down included (routed again into the hold): none released.
        assert not dropped and h.released == [] and h.nodes[1].mesh.held_reliable_count == len(published)
        h.heal(1, 2)
        h.run(60.0)
        delivered = [publication_text(i.publication) for n, i in h.delivered if n == 3]
        assert sorted(delivered) == sorted(published) and len(h.released) == len(published)


def test_a_parent_gone_before_routes_are_recomputed_is_a_counted_drop() -> None:
    """Between the neighbour going down and the next route computation, the old next hop has no transport:
    the publication is dropped with `no_route` (it used to vanish)."""
    h = Harness([(1, 2)], settings=Settings(hello_interval=0.2, spf_delay=0.5, spf_hold=0.5))
    h.run(1.0)
    h.do(2, "local_subscribe", "c", "t/#", 0)
    h.run(3.0)
    h.cut_link(1, 2)
    node = h.nodes[1]
    while not downs(h, 1):
        h.run(h.now + 0.01)
    publication = h.do(1, "local_publish", "t/x", b"p", 0, False, None)
    text = publication_text(publication)  # type: ignore[arg-type]
    reported = [e for e in expand_all(h.events) if e.get("pub") == text
                and e["type"] in ("publication_dropped", "publication_forwarded")]
    assert reported, "the publication was neither forwarded nor reported"
    assert reported[0]["type"] == "publication_dropped"
    assert node.drops["publication_no_route"] + node.drops["publication_no_core"] >= 1
