"""Reading the retained messages a broker already holds, so the federation gets those it does not know.

Theory of operation
-------------------
The wrapper's own connection subscribes to `#` with retain handling 2 (federation.daemon.broker): it sees live
publications, never the retained messages the broker held before. Those were published before the federation
existed, or while the wrapper was down or away from its broker, and without this they would be federated only
when published again (docs/protocol.md rule 10, "Retained messages the broker held before").

`RetainedScan` is one short-lived second connection, with its own client id (`scan_client_id`: the broker-log
tracker ignores it as it ignores the wrapper's own) and the same login (broker_auth.py). It subscribes to `#`
with retain handling 0 at QoS 2 (so each message comes with the QoS it was retained with) and to a fence topic
of its own under `$federation/` (which `#` does not match, so no subscriber and no wrapper sees it), then
publishes to the fence. The retained flag tells the retained messages apart from live publications (no
retain-as-published), which are left to the main connection. The fence does not simply come back last:
Mosquitto (2.0.11, measured) sends at most 20 QoS 1/2 messages in flight and queues the rest, and a new
message can go out while older ones still wait in that queue. So the fence is published again each time it
comes back after retained messages came since it was published, and the reading is complete when one comes
back with none (a round trip in which the broker, still sending as our acknowledgements free its window, sent
nothing: 1,500 retained messages of QoS 0-2 read whole in about 0.5 s). When the reading is complete, when the
connection fails or ends (no reconnection; Mosquitto closes it when its ACL refuses the fence), or after
`SCAN_TIMEOUT`, `done` gets what was read, once, from the scan's own thread (paho's network thread), and the
connection ends.

Under a topic policy the messages read are first seen as the federation would see them (`exported`: their
federation topic, those the policy keeps here left out). Which of them to originate is `to_originate`, a pure
rule (docs/protocol.md rule 10): a topic whose retained store entry changed while the scan ran is left alone
(the store's value is newer than the reading, and the broker has been given it or took it from a client);
otherwise a topic is originated when the store did not have it when the scan started, or had another payload
(a tombstone included). A value the store holds, whether
injected from the federation or taken from this broker before, is never originated again: that would give an
old value a new version, and it would win over newer ones.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.subscribeoptions import SubscribeOptions

from federation.daemon.broker import KEEPALIVE, BrokerAdapter
from federation.daemon.broker_auth import BrokerAuth
from federation.daemon.broker_items import Publication
from federation.daemon.clock import Clock
from federation.daemon.config import DaemonConfig
from federation.daemon.lean_client import stop_network_thread
from federation.daemon.local_publications import LocalPublications
from federation.daemon.mqtt_properties import properties_to_dict
from federation.daemon.policy_edges import PolicyEdges
from federation.daemon.retained import RetainedStore, RetainedValue
from federation.protocol.types import Address

log = logging.getLogger("federation.daemon")

SCAN_CLIENT_SUFFIX = "-retained-scan"
"""added to the wrapper's client id for the scan's connection"""
FENCE_PREFIX = "$federation/retained-scan/"
"""the fence topic is this and the scan's client id"""
SCAN_SUBSCRIPTIONS = 2
"""subscriptions the scan holds while it runs (`#` and the fence), which the broker counts"""
ACL_HINT = (f"if the broker has an acl_file, give the wrapper's user `topic readwrite {FENCE_PREFIX}#` "
            f"(configs/mosquitto.acl), so the reading can tell when it has everything")
"""what to do when the fence is refused (Mosquitto 2.0.11 closes the connection of a client whose publication its
ACL refuses)"""
MAX_CHECKED = 100
"""topics read at most by one check (`RetainedReading.check`); more wait for the next"""
SCAN_TIMEOUT = 10.0
"""seconds a scan may take: then what was read is used, and the rest waits for a next publication"""


def scan_client_id(client_id: str) -> str:
    """The client id of the scan's connection for a wrapper whose own connection is `client_id`."""
    return client_id + SCAN_CLIENT_SUFFIX


@dataclass(frozen=True, slots=True)
class HeldRetained:
    """A retained message the broker held, as the scan read it."""

    topic: str
    payload: bytes
    qos: int
    properties: dict[str, Any] | None
    """as for a local publication (federation.daemon.mqtt_properties); a message expiry is what is left"""


@dataclass
class ScanCounts:
    """What the readings of this run did (status `daemon.broker.retained_scan`)."""

    scans: int = 0
    """readings that ended"""
    incomplete: int = 0
    """of them, ended without the fence (a refused connection or subscription, the timeout)"""
    read: int = 0
    """retained messages read"""
    originated: int = 0
    """of them, originated (`to_originate`)"""
    checks: int = 0
    """readings of a few topics' values after a local write the wrapper could not order against a QoS 0 injection
    (federation.daemon.retained_order): not counted in `scans`"""
    repaired: int = 0
    """of the topics checked, those whose value on the broker the federation did not have: originated again"""


def exported(held: list[HeldRetained], edges: PolicyEdges) -> list[HeldRetained]:
    """The retained messages the broker held as the federation would know them: under their federation topic and
    QoS, those the topic policy keeps on this broker left out (counted). The retained store holds federation
    topics, so this comes before `to_originate`."""
    if not edges.active:
        return held
    found = []
    for message in held:
        crossing = edges.export(message.topic, message.qos)
        if crossing is not None:
            found.append(HeldRetained(crossing.topic, message.payload, crossing.qos, message.properties))
    return found


def to_originate(held: list[HeldRetained], before: Mapping[str, RetainedValue],
                 now: Mapping[str, RetainedValue]) -> Iterator[HeldRetained]:
    """The retained messages read from the broker the federation does not know (module docstring): `before` is
    the retained store's values when the scan started (a shallow copy), `now` the store's values now."""
    for message in held:
        known = before.get(message.topic)
        if now.get(message.topic) is not known:
            continue  # stored since the scan started: newer than what the scan read
        if known is not None and known.payload == message.payload:
            continue  # the store's own value (from the federation, or from this broker before)
        yield message


class RetainedScan:
    """One reading of the broker's retained messages on a connection of its own (module docstring)."""

    def __init__(self, broker: Address, client_id: str, auth: BrokerAuth,
                 done: Callable[[list[HeldRetained], str | None], None], timeout: float = SCAN_TIMEOUT,
                 topics: tuple[str, ...] = ("#",)) -> None:
        """`done(held, problem)` is called once, from another thread: `problem` is None when the fence came back,
        else why the reading may be incomplete. `topics`: what is read (every retained message, or the values of
        some topics: a check, `RetainedReading.check`)."""
        self.broker = broker
        self.topics = topics
        self.client_id = scan_client_id(client_id)
        self.fence = FENCE_PREFIX + self.client_id
        self._done = done
        self._held: list[HeldRetained] = []
        self._lock = threading.Lock()
        self._finished = False
        self._read_at_fence = 0
        """retained messages read when the fence was last published"""
        self._fence_refused: str | None = None
        """why the broker refused the fence (its ACL), if it did: the scan then ends at its timeout"""
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5)
        BrokerAdapter.apply_auth(client, auth)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        client.on_publish = self._on_publish
        client.on_disconnect = self._on_disconnect
        self.client = client
        self._timer = threading.Timer(timeout, self._timed_out, (timeout,))
        self._timer.daemon = True

    def start(self) -> None:
        """Connect and read, in paho's thread; never blocks."""
        self.client.connect_async(self.broker.host, self.broker.port, keepalive=KEEPALIVE, clean_start=True)
        self.client.loop_start()
        self._timer.start()

    def close(self) -> None:
        """End the scan now (the wrapper stops); `done` is not called any more."""
        with self._lock:
            self._finished = True
        self._timer.cancel()
        self.client.disconnect()
        stop_network_thread(self.client)

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self._finish(f"the broker refused the connection ({reason})")
            return
        client.subscribe([*((topic, SubscribeOptions(qos=2, retainHandling=SubscribeOptions.RETAIN_SEND_ON_SUBSCRIBE))
                            for topic in self.topics),
                          (self.fence, SubscribeOptions(qos=2))])

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self._finish("cannot connect to the broker")

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reasons: list[Any],
                      properties: Any) -> None:
        read = len(self.topics)
        refused = [reason for reason in reasons[:read] if reason.is_failure]
        if refused:
            self._finish(f"the broker refused the subscription to {self.topics[0] if read == 1 else 'a topic'} "
                         f"({refused[0]})")
            return
        if len(reasons) > read and reasons[read].is_failure:
            self._fence_refused = f"the broker refused the subscription to {self.fence} ({reasons[read]})"
        client.publish(self.fence, b"", qos=1)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        if message.topic == self.fence:
            with self._lock:
                read = len(self._held)
                quiet = read == self._read_at_fence
                self._read_at_fence = read
            if quiet:
                self._finish(None)
            else:  # more may wait in the broker's queue for this client: once more
                client.publish(self.fence, b"", qos=1)
        elif message.retain and message.payload:
            held = HeldRetained(message.topic, bytes(message.payload), message.qos,
                                properties_to_dict(getattr(message, "properties", None)))
            with self._lock:
                if not self._finished:
                    self._held.append(held)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        # No reconnection: a broker that restarted meanwhile may hold an older persistence file's values.
        self._finish(f"the broker closed the connection before the fence came back ({reason}); {ACL_HINT}")

    def _on_publish(self, client: mqtt.Client, userdata: Any, mid: int, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self._fence_refused = f"the broker refused the publication to {self.fence} ({reason})"

    def _timed_out(self, timeout: float) -> None:
        refused = self._fence_refused
        self._finish(f"{refused}; {ACL_HINT}" if refused is not None
                     else f"the fence did not come back within {timeout:g} s")

    def _finish(self, problem: str | None) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
            held = list(self._held)
        self._timer.cancel()
        self.client.disconnect()
        stop_network_thread(self.client)  # from paho's own thread it does not wait for itself
        self._done(held, problem)


class RetainedReading:
    """The loop's side of the readings (on the loop's thread): when one is due and may start, and what its end
    does. A reading is due after a connection on which the broker kept the wrapper's session (it then holds what
    it held before, not an older persistence file's values); it starts once the wrapper is ready and a neighbour
    is up (what is originated must have somewhere to go), is dropped when the broker restarts meanwhile, and its
    end originates, as local retained publications, the values the federation does not know (`to_originate`)."""

    def __init__(self, config: DaemonConfig, loop: asyncio.AbstractEventLoop, clock: Clock, retained: RetainedStore,
                 local: LocalPublications, helpers_subscribed: Callable[[int, float], None],
                 may_start: Callable[[], bool], stopping: Callable[[], bool], drain: Callable[[float], None]) -> None:
        """`helpers_subscribed(count, now)`: the broker counts the reading's subscriptions meanwhile
        (BrokerSubscriptions); `may_start`: the wrapper is ready and a neighbour is up; `stopping`: nothing that
        ends after the shutdown began is used; `drain`: sends what the node made of a reading's end."""
        self.config = config
        self.loop = loop
        self.clock = clock
        self.retained = retained
        self.local = local
        self._helpers_subscribed = helpers_subscribed
        self._may_start = may_start
        self._stopping = stopping
        self._drain = drain
        self.scan: RetainedScan | None = None
        """the reading under way"""
        self.counts = ScanCounts()
        self.due = False
        """the broker connected with the session kept: its retained messages are read once the wrapper may"""
        self.checks_due: set[str] = set()
        """topics whose value on the broker is to be read (`check`)"""

    def connected(self, session_lost: bool, now: float) -> None:
        """The broker connection came up: a reading is due if it kept our session; one under way while a broker
        without it restarted is of no use."""
        self.due = not session_lost
        if session_lost and self.scan is not None:
            self._drop(now)
        self.start_if_due(now)

    def check(self, topics: set[str], now: float) -> None:
        """Read these topics' values on the broker (a local write on each may have been ordered against a QoS 0
        injection the wrapper could not place: federation.daemon.retained_order): a value the federation does not
        have is originated again, as any the reading finds, so every broker converges on what this one holds."""
        self.checks_due |= topics
        self.start_if_due(now)

    def start_if_due(self, now: float) -> None:
        """Start a reading on a second connection when one is due (a whole one, else a check), none is under way
        and the wrapper may; the store's values now are what the reading is compared with."""
        if not (self.due or self.checks_due) or self.scan is not None or not self._may_start():
            return
        topics: tuple[str, ...] = ("#",)
        if self.due:
            self.due = False
            self.checks_due.clear()  # the whole reading covers them
        else:
            topics = tuple(sorted(self.checks_due)[:MAX_CHECKED])
            self.checks_due.difference_update(topics)
        before = dict(self.retained.values)
        loop = self.loop
        scan: RetainedScan | None = None

        def done(held: list[HeldRetained], problem: str | None) -> None:  # on the scan's thread
            loop.call_soon_threadsafe(self._ended, scan, before, held, problem)

        config = self.config
        scan = RetainedScan(config.broker, config.client_id, config.broker_auth, done, topics=topics)
        self.scan = scan
        self._helpers_subscribed(len(topics) + 1, now)
        scan.start()

    def close(self) -> None:
        """The wrapper stops: a reading under way ends with it."""
        if self.scan is not None:
            self.scan.close()
            self.scan = None

    def _drop(self, now: float) -> None:
        """The reading under way is not used (the broker restarted meanwhile); it ends off the loop's thread."""
        scan = self.scan
        if scan is not None:
            self.scan = None
            self._helpers_subscribed(0, now)
            self.loop.run_in_executor(None, scan.close)

    def _ended(self, scan: RetainedScan | None, before: dict[str, RetainedValue], held: list[HeldRetained],
               problem: str | None) -> None:
        """A reading ended: those the federation does not know are originated (docs/protocol.md rule 10)."""
        if scan is not self.scan or self._stopping():
            return
        self.scan = None
        now = self.clock.now()
        self._helpers_subscribed(0, now)
        originated = self.local.originate_held(
            [Publication(message.topic, message.payload, message.qos, True, message.properties)
             for message in to_originate(exported(held, self.local.edges), before, self.retained.values)], now)
        counts = self.counts
        if scan is not None and scan.topics != ("#",):
            counts.checks += 1
            counts.repaired += originated
            if originated:
                log.info("the broker held another retained value than the federation for %d of the %d topics "
                         "checked after writes the wrapper could not order: originated again", originated,
                         len(scan.topics))
            self._drain(now)
            self.start_if_due(now)
            return
        counts.scans += 1
        counts.read += len(held)
        counts.originated += originated
        if problem is not None:
            counts.incomplete += 1
            log.warning("reading the broker's retained messages on a second connection (client id %r) may be "
                        "incomplete: %s; those not read are federated when published again",
                        scan_client_id(self.config.client_id), problem)
        log.info("the broker holds %d retained messages: %d of them the federation did not know, originated now",
                 len(held), originated)
        self._drain(now)
