"""A neighbour that announces a new id or epoch is sent the database again, but at most once per hello interval."""

from __future__ import annotations

from test_node_overlay import up_node

from federation.protocol import wire
from federation.protocol.settings import Settings
from federation.protocol.types import BrokerId


def test_a_key_holder_changing_its_id_on_every_packet_gets_the_table_once_per_hello_interval() -> None:
    settings = Settings()
    node, peers = up_node(2, settings)
    peer = peers[0]
    database_sends = 0
    packets = 0
    for step in range(200):  # 2 s of a packet every 10 ms, each with a new vid
        now = 2.0 + step * 0.01
        packets += 1
        sender = wire.Sender(BrokerId(1000 + packets, peer), 1)
        node.receive_packet(wire.encode(wire.HELLO, sender, wire.Hello(packets, now)), peer, now)
        timer = node.get_timer()
        if timer is not None and timer <= now + 0.01:
            node.handle_timer(now + 0.01)
        database_sends += sum(1 for data, target in node.packets_to_send()
                              if target == peer and wire.packet_type(data) == wire.TOPOLOGY_UPDATE)
    assert packets == 200
    # one resend at once, then at most one per hello interval (2 s / 1 s): not one per packet
    assert 1 <= database_sends <= 3, database_sends
    assert node.counters["resyncs_deferred"] >= 1


def test_a_restarted_neighbour_is_resynchronised_at_once() -> None:
    node, peers = up_node(2, Settings())
    peer = peers[0]
    sender = wire.Sender(BrokerId(1, peer), 2)  # epoch 1 -> 2: it restarted
    node.receive_packet(wire.encode(wire.HELLO, sender, wire.Hello(1, 5.0)), peer, 5.0)
    assert any(target == peer and wire.packet_type(data) == wire.TOPOLOGY_UPDATE
               for data, target in node.packets_to_send())
