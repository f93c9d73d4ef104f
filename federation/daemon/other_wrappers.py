"""Another wrapper on the same broker: found at start, named, and refused unless allowed (`allow_other_wrappers`).

Theory of operation
-------------------
Two wrappers beside one broker each take the other's `#` subscription for a
client's, and federate everything twice. Nothing in Mosquitto lists the
clients connected before one's own connection, and the broker's log shows
only what happens after it, so every wrapper leaves a record on its broker:
a retained message on `$federation/wrappers/<client id>` (its overlay
address, name, host, process, start time), held by a connection of its own
(`<client id>-presence`) whose will, an empty retained message on the same
topic, removes the record when the connection drops without a goodbye (a
crash, a kill -9, a lost host), and removed by the wrapper itself when it
stops. The record carries an MQTT message expiry (RECORD_LIFETIME) and is
published again every third of it, so a record that outlived its wrapper
(a broker that restored it from its persistence file after both went down)
expires by itself.

At start, before the wrapper's own connection subscribes to anything, that
connection subscribes to `$federation/wrappers/+` and reads the retained
records up to a fence (its own non-retained message on the same filter,
which arrives after them), then unsubscribes and publishes its own record. A
record under another client id is another wrapper: the start is refused
(StartupError, exit status 2) with a message naming it and saying how to
allow it; with `allow_other_wrappers` the wrapper logs the same and goes on.
A record under this wrapper's own client id is its own earlier life.

The look cannot always be had, and then the wrapper starts and says why: a
broker not reachable yet (the wrapper keeps trying, as for its main
connection, and looks when it connects), or an ACL without the line
`topic readwrite $federation/wrappers/#` (configs/mosquitto.acl has it).
Mosquitto 2.0 closes the connection of a client whose publication its ACL
refuses: the record's connection then gives up, once, with a warning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from federation.daemon.broker import KEEPALIVE, BrokerAdapter
from federation.daemon.config import DaemonConfig
from federation.daemon.lean_client import stop_network_thread

log = logging.getLogger("federation.daemon.other_wrappers")

PREFIX = "$federation/wrappers/"
SUFFIX = "-presence"
"""added to the wrapper's client id for the connection that holds its record"""
RECORD_LIFETIME = 90
"""seconds a record lives (its MQTT message expiry) unless published again; it is, every third of that"""
CHECK_TIMEOUT = 5.0
"""seconds the look at start may take; then the wrapper starts without it and says so"""
ACL_HINT = ("if the broker has an acl_file, give the wrapper's user `topic readwrite $federation/wrappers/#` "
            "(`federation-configs show mosquitto.acl`)")
ALLOW_HINT = ("stop the other wrapper, point one of them at another broker, or, if both must run, give "
              "`--allow-other-wrappers` (allow_other_wrappers: true, MQTT_FEDERATION_ALLOW_OTHER_WRAPPERS=true)")


class OtherWrapperError(Exception):
    """Another wrapper holds a record on this broker and it was not allowed."""


@dataclass(frozen=True)
class Record:
    """What another wrapper says of itself."""

    client_id: str
    fields: dict[str, Any]

    def describe(self) -> str:
        fields = self.fields
        where = f"{fields.get('host', '?')} pid {fields.get('pid', '?')}"
        name = f" ({fields['name']})" if fields.get("name") else ""
        started = fields.get("started")
        since = f", running since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}" \
            if isinstance(started, (int, float)) else ""
        return f"client {self.client_id!r}{name}, overlay address {fields.get('address', '?')}, on {where}{since}"


class Presence:
    """This wrapper's record on its broker, and the look at other wrappers' (module docstring).

    `look` at start, then `hold` (publish the record and keep it) unless the start is refused, `close` at the
    end. Everything else happens on paho's network thread."""

    def __init__(self, config: DaemonConfig, lifetime: int = RECORD_LIFETIME) -> None:
        self.config = config
        self.lifetime = lifetime
        self.topic = PREFIX + config.client_id
        self.fence = PREFIX + config.client_id + SUFFIX + "-fence"
        self.record = json.dumps({
            "client_id": config.client_id, "address": str(config.announced), "name": config.name,
            "host": socket.gethostname(), "pid": os.getpid(), "started": round(time.time(), 3),
        }, separators=(",", ":")).encode()
        self.others: list[Record] = []
        self.problem: str | None = None
        """why the look could not be had at start, if it could not"""
        self.pending = False
        """the look waits for the broker (it happens, and only logs, once the broker answers)"""
        self._lock = threading.Lock()
        self._answered = threading.Event()
        """the look is done, or the broker cannot be reached now: `look` returns"""
        self._looked = False
        self._returned = False
        """`look` returned: what the look finds from now on is only logged"""
        self._wanted = False
        """`hold` was called: the record is published once the look is done"""
        self._holding = False
        self._closed = False
        self._record_unacknowledged = False
        self._fence_sent = False
        self._refresh: threading.Timer | None = None
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=config.client_id + SUFFIX, protocol=mqtt.MQTTv5)
        BrokerAdapter.apply_auth(client, config.broker_auth)
        client.will_set(self.topic, b"", qos=1, retain=True)
        client.reconnect_delay_set(1, 30)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_disconnect = self._on_disconnect
        self.client = client

    # What the runtime calls.

    def look(self, timeout: float = CHECK_TIMEOUT) -> list[Record]:
        """Connect and read the records up to the fence: the other wrappers found. Returns at once when the broker
        cannot be reached (`problem` says so; the look happens when it connects, and only logs), at most after
        `timeout`."""
        self.client.connect_async(self.config.broker.host, self.config.broker.port, keepalive=KEEPALIVE,
                                  clean_start=True)
        self.client.loop_start()
        self._answered.wait(timeout)
        with self._lock:
            self._returned = True
            if not self._looked and not self._closed:
                self.pending = True
                if self.problem is None:
                    self.problem = f"no answer from the broker within {timeout:g} s"
            return list(self.others) if self._looked else []

    def hold(self) -> None:
        """Publish this wrapper's record (now, or once the look is done) and keep it while the wrapper runs."""
        with self._lock:
            self._wanted = True
            ready = self._looked and not self._closed
        if ready:
            self._publish_record()

    def close(self) -> None:
        """Remove the record and disconnect (the wrapper stops, or was refused)."""
        with self._lock:
            self._closed = True
            refresh, self._refresh = self._refresh, None
            holding = self._holding
        if refresh is not None:
            refresh.cancel()
        if holding and self.client.is_connected():
            with contextlib.suppress(RuntimeError, ValueError):  # the connection went meanwhile
                self.client.publish(self.topic, b"", qos=1, retain=True).wait_for_publish(2.0)
        self.client.disconnect()
        stop_network_thread(self.client)

    # paho's callbacks, on its network thread.

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self._gave_up(f"the broker refused the connection ({reason})")
            return
        with self._lock:
            looked, holding = self._looked, self._holding
        if not looked:
            client.subscribe(PREFIX + "+", qos=1)
        elif holding:  # a reconnection: the broker may have lost the record
            self._publish_record()

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        with self._lock:
            if not self._looked and not self._returned:
                self.problem = "the broker cannot be reached yet"
        self._answered.set()

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reasons: list[Any],
                      properties: Any) -> None:
        with self._lock:
            if self._looked:
                return
        if reasons and reasons[0].is_failure:
            self._gave_up(f"the broker refused the subscription to {PREFIX}+ ({reasons[0]}); {ACL_HINT}")
            return
        with self._lock:
            self._fence_sent = True
        client.publish(self.fence, b"", qos=1)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        if message.topic == self.fence:
            client.unsubscribe(PREFIX + "+")
            self._finish_look()
            return
        if not message.retain or not message.payload:
            return
        client_id = message.topic[len(PREFIX):]
        if client_id == self.config.client_id:
            return  # this wrapper's own earlier life
        try:
            fields = json.loads(bytes(message.payload))
        except ValueError:
            fields = {}
        with self._lock:
            if not self._looked:
                self.others.append(Record(client_id, fields if isinstance(fields, dict) else {}))

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        with self._lock:
            self._record_unacknowledged = False

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        with self._lock:
            fence_refused = self._fence_sent and not self._looked and not self._closed
            refused = self._holding and self._record_unacknowledged and not self._closed
            if refused:
                self._closed = True
        if fence_refused:  # Mosquitto 2.0 reads a subscription's ACL at delivery, a publication's at once
            self._gave_up(f"the broker closed the connection when it was sent {self.fence} ({reason}); "
                          f"{ACL_HINT}")
            return
        if refused:  # Mosquitto 2.0 closes the connection of a client whose publication its ACL refuses
            log.warning("the broker closed the connection that holds this wrapper's record (%s) right after it "
                        "was published: wrappers starting later on this broker will not see this one; %s",
                        self.topic, ACL_HINT)
            client.disconnect()  # no more reconnections

    # Helpers.

    def _finish_look(self) -> None:
        with self._lock:
            if self._looked:
                return
            self._looked = True
            late, wanted, others = self._returned, self._wanted, list(self.others)
        self._answered.set()
        if late:  # the wrapper started without the look: it can only say what it found
            for other in others:
                log.error("another federation wrapper holds a record on broker %s: %s. Each wrapper takes the "
                          "other's subscription to # for a client's and the federation carries everything twice; "
                          "%s", self.config.broker, other.describe(), ALLOW_HINT)
        if wanted:
            self._publish_record()

    def _publish_record(self) -> None:
        properties = Properties(PacketTypes.PUBLISH)
        properties.MessageExpiryInterval = self.lifetime
        with self._lock:
            if self._closed:
                return
            self._holding = True
            self._record_unacknowledged = True
        self.client.publish(self.topic, self.record, qos=1, retain=True, properties=properties)
        self._schedule_refresh()

    def _schedule_refresh(self) -> None:
        timer = threading.Timer(self.lifetime / 3, self._refresh_record)
        timer.daemon = True
        with self._lock:
            if self._closed:
                return
            if self._refresh is not None:
                self._refresh.cancel()
            self._refresh = timer
        timer.start()

    def _refresh_record(self) -> None:
        if self.client.is_connected():
            self._publish_record()
        else:
            self._schedule_refresh()  # published again on the reconnection; look later meanwhile

    def _gave_up(self, problem: str) -> None:
        """No look, no record (a refused connection or subscription); `check` says so at start, this later."""
        with self._lock:
            self.problem = problem
            self._closed = True
            late = self._returned
        self._answered.set()
        if late:
            log.warning("could not look for other wrappers on broker %s: %s", self.config.broker, problem)
        self.client.disconnect()


def check(presence: Presence, allowed: bool) -> None:
    """The look at start: OtherWrapperError naming the others unless `allowed` (then they are logged); the
    record held from now on otherwise."""
    others = presence.look()
    if presence.pending:  # the broker is down or slow: not a problem of this wrapper's, and the look follows
        log.info("the look for other wrappers on broker %s waits for it (%s)", presence.config.broker,
                 presence.problem)
    elif presence.problem is not None:
        log.warning("could not look for other wrappers on broker %s at start: %s; starting without the look",
                    presence.config.broker, presence.problem)
    if others:
        named = "; ".join(other.describe() for other in others)
        what = (f"{len(others)} other federation wrapper(s) hold a record on broker {presence.config.broker}: "
                f"{named}. Each wrapper would take the other's subscription to # for a client's and the "
                f"federation would carry everything twice")
        if not allowed:
            raise OtherWrapperError(f"{what}; {ALLOW_HINT}")
        log.warning("%s; allowed by allow_other_wrappers, starting anyway", what)
    presence.hold()
