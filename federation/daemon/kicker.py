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
acknowledged, again): the kicker takes it all, up to a fence it publishes on `FENCE_PREFIX` (a topic of its own,
subscribed to at QoS 2 after the client's subscriptions: Mosquitto sends one client's QoS 1/2 messages in order),
or for `DRAIN_TIMEOUT` at most, and hands it over, in order. Its connection is recognised in the broker's log by
its source address (`BrokerLogTracker.add_kicker`, before the CONNECT is sent), so its lines are the wrapper's own,
not the client's.

paho in its own network thread (as the retained scan, retained_scan.py); `done` is called once, from that thread.
"""

from __future__ import annotations

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

from federation.daemon.broker import KEEPALIVE, BrokerAdapter
from federation.daemon.broker_auth import BrokerAuth
from federation.daemon.client_registry import MAX_HANDOVER_MESSAGES, Message
from federation.daemon.lean_client import stop_network_thread
from federation.daemon.mqtt_properties import properties_to_dict
from federation.protocol.types import Address

FENCE_PREFIX = "$federation/handover/"
"""the kicker's fence topic is this and a name of its own (the wrapper's user needs `topic readwrite
$federation/handover/#` in an ACL: configs/mosquitto.acl)"""
DRAIN_TIMEOUT = 10.0
"""seconds a takeover may take at most (connection, drain): then what was read is handed over"""
RECEIVE_MAXIMUM = 65535
_numbers = itertools.count(1)


@dataclass
class Outcome:
    """What a takeover did: `session_present` (the broker had kept the session: its queue is `messages`), `problem`
    (None when the fence came back, or nothing was to drain), `lost` (messages beyond `MAX_HANDOVER_MESSAGES`)."""

    session_present: bool = False
    messages: list[Message] = field(default_factory=list)
    problem: str | None = None
    lost: int = 0


class SessionKicker:
    """One takeover of `client` on the broker (module docstring). `opened(address)`: the connection's local
    "host:port", told before its CONNECT is sent (for the log tracker); `done(outcome)` once, from paho's thread."""

    def __init__(self, broker: Address, auth: BrokerAuth, client: str, clean: bool, wrapper_id: str,
                 opened: Callable[[str], None], done: Callable[[Outcome], None],
                 timeout: float = DRAIN_TIMEOUT) -> None:
        self.broker = broker
        self.client_id = client
        self.clean = clean
        self.fence = f"{FENCE_PREFIX}{wrapper_id}/{os.getpid()}-{next(_numbers)}"
        self._opened = opened
        self._done = done
        self._outcome = Outcome()
        self._lock = threading.Lock()
        self._finished = False
        paho = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client, protocol=mqtt.MQTTv5,
                           reconnect_on_failure=False)
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
        paho.publish(self.fence, b"", qos=1)

    def _on_message(self, paho: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        if message.topic == self.fence:
            self._finish(None)
            return
        outcome = self._outcome
        with self._lock:
            if self._finished:
                return
            if len(outcome.messages) >= MAX_HANDOVER_MESSAGES:
                outcome.lost += 1
                return
            outcome.messages.append((message.topic, bytes(message.payload), message.qos, bool(message.retain),
                                     properties_to_dict(getattr(message, "properties", None))))

    def _on_disconnect(self, paho: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self._finish(f"the broker closed the connection ({reason})")

    def _finish(self, problem: str | None) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
            outcome = self._outcome
        outcome.problem = problem
        self._timer.cancel()
        self.paho.disconnect()  # DISCONNECT, reason 0: no will (it has none); its session, expiry 0, ends
        stop_network_thread(self.paho)
        self._done(outcome)
