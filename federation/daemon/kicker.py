"""Taking a client id over on the local broker, as the broker itself would if the client connected to it again
(issue 39, item 3: federation.daemon.roaming decides when).

Theory of operation
-------------------
Mosquitto closes a client's connection, ends or resumes its session and sends or cancels its will when a new
CONNECT comes with the same client id. The wrapper makes that CONNECT itself (`SessionKicker`): a connection with
the client's id and the clean start of the client's new connection on another broker, so the broker applies its
own rules, exactly as if the client had come back here (the old connection closed; clean start 0 resumes the
session, its pending Will Delay cancelled, its queued messages sent to us; clean start 1 discards it, the will sent
at once when it has no delay), with no will and a session expiry of 0 of its own, so the session ends with this
connection and the broker stops queueing for it.

With the session resumed, the broker sends what it had queued for the client (and what it had sent and not seen
acknowledged, again): the kicker takes it all, up to a fence, or for `DRAIN_TIMEOUT` at most, and hands it over,
in order. The fence is a topic of its own under `FENCE_PREFIX`, subscribed to after the client's subscriptions
(Mosquitto sends one client's QoS 1/2 messages in order); once that subscription is granted, `ready(fence)` is
called and the wrapper publishes the fence on its own broker connection, behind its injections, and reads it back
there (federation.daemon.roaming: so it knows which publications the session had). QoS 0 messages are not handed
over: Mosquitto queues none for a session without a connection, and those it sends live to the kicker the new
broker has too. Its connection is recognised in the broker's log by its source address
(`BrokerLogTracker.add_kicker`, before the CONNECT is sent), so its lines are the wrapper's own, not the client's.

The connection is a `LeanClient` with manual acknowledgements, which hands a QoS 2 message over at its PUBLISH:
paho's own client hands it over at the PUBREL, and the fence, QoS 1, overtook the PUBRELs of the QoS 2 messages
just before it (they were acknowledged and never handed over: a loss each, seen behind a load balancer). With
another paho (`missing_paho_names`) the public client is used and that can happen again. A PUBREL for a packet id
the kicker never answered is a QoS 2 message the client itself had taken (PUBREC) when it went: one broker would
send the PUBREL again when the client comes back and the client would hand it over then; the new broker cannot
(it answers session present 0, and MQTT 5 has the client discard such a message), so it is counted
(`Outcome.unreleased`) and said in docs/transparency.md.

paho in its own network thread (as the retained scan, retained_scan.py); `ready` at most once and then `done`
once, from that thread.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from federation.daemon.broker import FENCE_PREFIX, KEEPALIVE, BrokerAdapter
from federation.daemon.broker_auth import BrokerAuth
from federation.daemon.client_registry import MAX_HANDOVER_MESSAGES, Message
from federation.daemon.lean_client import LeanClient, PublicClient, missing_paho_names, stop_network_thread
from federation.daemon.mqtt_properties import properties_to_dict
from federation.protocol.types import Address

DRAIN_TIMEOUT = 10.0
"""seconds a takeover may take at most (connection, drain): then what was read is handed over"""
RECEIVE_MAXIMUM = 65535
_numbers = itertools.count(1)


@functools.cache
def _paho_differs() -> bool:
    """The installed paho lacks what `LeanClient` uses (asked once)."""
    return bool(missing_paho_names())


@dataclass
class Outcome:
    """What a takeover did: `session_present` (the broker had kept the session: its queue is `messages`), `problem`
    (None when the fence came back, or nothing was to drain), `lost` (messages beyond `MAX_HANDOVER_MESSAGES`)."""

    session_present: bool = False
    messages: list[Message] = field(default_factory=list)
    problem: str | None = None
    lost: int = 0
    unreleased: int = 0
    """QoS 2 messages the client had taken and not been released when it went (module docstring)"""


class SessionKicker:
    """One takeover of `client` on the broker (module docstring). `opened(address)`: the connection's local
    "host:port", told before its CONNECT is sent (for the log tracker); `ready(fence)`: the fence may be published
    (on the wrapper's connection: `BrokerAdapter.publish_fence`); `done(outcome)` once; all from paho's thread."""

    def __init__(self, broker: Address, auth: BrokerAuth, client: str, clean: bool, wrapper_id: str,
                 opened: Callable[[str], None], ready: Callable[[str], None], done: Callable[[Outcome], None],
                 timeout: float = DRAIN_TIMEOUT) -> None:
        self.broker = broker
        self.client_id = client
        self.clean = clean
        self.fence = f"{FENCE_PREFIX}{wrapper_id}/{os.getpid()}-{next(_numbers)}"
        self._opened = opened
        self._ready = ready
        self._done = done
        self._outcome = Outcome()
        self._lock = threading.Lock()
        self._finished = False
        paho: LeanClient | PublicClient = (PublicClient if _paho_differs() else LeanClient)(
            CallbackAPIVersion.VERSION2, client_id=client, protocol=mqtt.MQTTv5, reconnect_on_failure=False,
            manual_ack=True)
        BrokerAdapter.apply_auth(paho, auth)
        paho.on_socket_open = self._on_socket_open
        paho.on_connect = self._on_connect
        paho.on_connect_fail = lambda *_args: self._finish("cannot connect to the broker")
        paho.on_subscribe = self._on_subscribe
        paho.on_message = self._on_message
        paho.on_disconnect = self._on_disconnect
        self.paho = paho
        self._timer = threading.Timer(timeout, self._finish, (f"the drain did not end within {timeout:g} s",))
        self._timer.daemon = True

    def start(self) -> None:
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = 0
        properties.ReceiveMaximum = RECEIVE_MAXIMUM
        self.paho.connect_async(self.broker.host, self.broker.port, keepalive=KEEPALIVE, clean_start=self.clean,
                                properties=properties)
        self.paho.loop_start()
        self._timer.start()

    def close(self) -> None:
        """The wrapper stops: end now, `done` not called any more."""
        with self._lock:
            self._finished = True
        self._timer.cancel()
        self.paho.disconnect()
        stop_network_thread(self.paho)

    # paho's callbacks (its thread)

    def _on_socket_open(self, paho: mqtt.Client, userdata: Any, sock: Any) -> None:
        try:
            host, port = sock.getsockname()[:2]
        except (OSError, AttributeError):
            return
        self._opened(f"{host}:{port}")

    def _on_connect(self, paho: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self._finish(f"the broker refused the connection as {self.client_id!r} ({reason})")
            return
        self._outcome.session_present = bool(flags.session_present)
        if not self._outcome.session_present:
            self._finish(None)  # nothing queued: the connection's end ends the takeover
            return
        paho.subscribe(self.fence, options=SubscribeOptions(qos=2))

    def _on_subscribe(self, paho: mqtt.Client, userdata: Any, mid: int, reasons: list[Any], properties: Any) -> None:
        if reasons and reasons[0].is_failure:
            self._finish(f"the broker refused the subscription to {self.fence} ({reasons[0]}): give the wrapper's "
                         f"user `topic readwrite {FENCE_PREFIX}#` (configs/mosquitto.acl)")
            return
        self._ready(self.fence)

    def _on_message(self, paho: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        if message.topic == self.fence:
            self._finish(None)
            return
        if message.qos == 0:
            return  # sent live while the kicker is connected: the new broker has it too (module docstring)
        outcome = self._outcome
        with self._lock:
            if self._finished:
                return
            if len(outcome.messages) >= MAX_HANDOVER_MESSAGES:
                outcome.lost += 1
            else:
                outcome.messages.append((message.topic, bytes(message.payload), message.qos, bool(message.retain),
                                         properties_to_dict(getattr(message, "properties", None))))
        self.paho.send_acks([(message.mid, message.qos)])  # taken: the session would send it again otherwise

    def _on_disconnect(self, paho: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self._finish(f"the broker closed the connection ({reason})")

    def _finish(self, problem: str | None) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
            outcome = self._outcome
        outcome.problem = problem
        outcome.unreleased = getattr(self.paho, "releases_unanswered", 0)
        self._timer.cancel()
        self.paho.disconnect()  # DISCONNECT, reason 0: no will (it has none); its session, expiry 0, ends
        stop_network_thread(self.paho)
        self._done(outcome)
