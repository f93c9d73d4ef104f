"""QoS 0 runs into the local broker (`InjectionRun`): the injector writes the bytes `publish_all` writes for the
same publications, and the runtime takes the direct path only when nothing waits and nothing is held."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from federation.daemon.broker import BrokerAdapter
from federation.daemon.broker_items import BrokerItem, LogLine, Publication, PublicationRun, split_oversized_runs
from federation.protocol.types import Address, Injection, InjectionRun, expand_runs

from mqtt_bytes import adapter_on_socketpair, read_all
from runtime_util import started_wrapper

ORIGIN = Address("10.0.0.1", 10500)


def run_of(topics: list[str], first_seq: int = 1) -> InjectionRun:
    return InjectionRun(topics, [topic.encode() * 3 for topic in topics], ORIGIN, 7,
                        list(range(first_seq, first_seq + len(topics))), "f/#")


@pytest.fixture
def adapter() -> Iterator[tuple[BrokerAdapter, socket.socket]]:
    with adapter_on_socketpair("runs-test", lambda item: None) as (adapter, peer):
        adapter.connected = True
        yield adapter, peer


def test_a_run_is_written_as_its_injections_would_be(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer = adapter
    runs = [run_of([f"f/{i}" for i in range(50)]), run_of(["f/é", "f/x"], 100)]
    adapter_.publish_all(expand_runs(list(runs)))
    expected = read_all(peer)
    injected = adapter_.injected
    adapter_.publish_runs(runs)
    assert read_all(peer) == expected and len(expected) > 50 * 8
    assert adapter_.injected == 2 * injected == 2 * 52


def test_a_topic_paho_refuses_in_a_run_is_refused_alone_and_the_rest_written(adapter) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer = adapter
    adapter_.publish_runs([run_of(["f/1", "f/+", "f/2", "f/3"])])
    written = read_all(peer)
    assert b"f/1" in written and b"f/2" in written and b"f/3" in written and b"f/+" not in written
    assert adapter_.injected == 3 and adapter_.inject_failed == 1


def test_expanded_runs_are_the_injections_a_loop_would_make() -> None:
    run = run_of(["f/a", "f/b"], 5)
    assert run.injections() == [Injection("f/a", b"f/af/af/a", 0, False, None, (ORIGIN, 7, 5), "f/#"),
                                Injection("f/b", b"f/bf/bf/b", 0, False, None, (ORIGIN, 7, 6), "f/#")]
    single = Injection("g", b"", 1, False, None, (ORIGIN, 7, 9), "g")
    assert expand_runs([single, run, single]) == [single, *run.injections(), single]
    kept = [single]
    assert expand_runs(kept) is kept  # nothing to expand: no copy


class _Broker:
    """What `_route_outputs` asks of the broker adapter, recording what it is handed."""

    def __init__(self, blocked: bool = False) -> None:
        self.connected = True
        self.output_blocked = blocked
        self.max_qos = 2
        self.runs: list[InjectionRun] = []
        self.injections: list[Injection] = []

    def publish_runs(self, runs: list[InjectionRun]) -> None:
        self.runs += runs

    def publish_all(self, injections: list[Injection]) -> None:
        self.injections += injections

    def injection_window(self) -> int:
        return 20

    def backlog(self) -> int:
        return 0

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: None  # reading pauses, resumes: nothing to record here


@pytest.mark.parametrize("case", ["direct", "with an injection", "blocked", "held"])
def test_the_runtime_writes_runs_whole_only_when_nothing_waits(case: str) -> None:
    async def scenario() -> tuple[_Broker, int]:
        wrapper = await started_wrapper()
        fake = _Broker(blocked=case == "blocked")
        wrapper.broker = fake  # type: ignore[assignment]
        try:
            if case == "held":
                wrapper.broker_subscriptions.hold.deadline = wrapper.clock.now() + 30.0  # a broker restart's hold
            run = run_of(["f/1", "f/2"])
            wrapper.node.outbox.injections.append(run)
            if case == "with an injection":
                wrapper.node.outbox.injections.append(Injection("f/3", b"p", 0, False, None, (ORIGIN, 7, 3), "f/#"))
            wrapper._route_outputs(wrapper.clock.now())
            queued = len(wrapper.flow.injection_queue)
        finally:
            wrapper.close()
        return fake, queued

    fake, queued = asyncio.run(scenario())
    if case == "direct":
        assert fake.runs and not fake.injections and not queued
    elif case == "blocked":  # queued, each, to be written when the socket takes bytes again
        assert not fake.runs and not fake.injections and queued == 2
    else:  # with an injection: handed over one by one, in order; held: the restart's hold judged each (and let
        # them through: no filter of theirs is waiting for a subscription)
        expected = ["f/1", "f/2", "f/3"] if case == "with an injection" else ["f/1", "f/2"]
        assert not fake.runs and [i.topic for i in fake.injections] == expected and not queued


def test_a_run_holding_a_publication_above_the_limit_is_taken_one_at_a_time() -> None:
    """The runtime refuses that one (counted, as a `Publication` of its own would be) and hands the rest to the node
    in order; all are acknowledged to the broker."""
    async def scenario() -> tuple[list[tuple[Any, ...]], list[list[tuple[int, int]]], int]:
        wrapper = await started_wrapper()
        limit = wrapper.node.settings.max_publication_bytes
        calls: list[tuple[Any, ...]] = []
        acknowledged: list[list[tuple[int, int]]] = []
        wrapper.node.local_publish_run = (  # type: ignore[method-assign]
            lambda run, now, qos=0: calls.append(("run", qos, [t for t, _ in run])) or [None] * len(run))
        wrapper.broker.acknowledge = acknowledged.append  # type: ignore[method-assign]
        try:
            wrapper._on_broker_items([PublicationRun(["a/1", "a/2", "a/3", "a/4"],
                                                     [b"x", b"y" * (limit + 1), b"z", b"w"], 1, [1, 2, 3, 4])])
            refused = wrapper.node.drops["publication_too_large"]
        finally:
            wrapper.close()
        return calls, acknowledged, refused

    calls, acknowledged, refused = asyncio.run(scenario())
    assert refused == 1
    assert calls == [("run", 1, ["a/1", "a/3", "a/4"])]  # as for `Publication`s: the refusal does not end the run
    assert len(acknowledged) == 1 and sorted(acknowledged[0]) == [(1, 1), (2, 1), (3, 1), (4, 1)]


def test_split_oversized_runs_leaves_other_batches_as_they_are() -> None:
    batch: list[BrokerItem] = [PublicationRun(["a"], [b"12"], 0, []), LogLine("$SYS/broker/log/N", b"x")]
    assert split_oversized_runs(batch, 2) is batch
    assert split_oversized_runs(batch, 1) == [Publication("a", b"12", 0, False, None), batch[1]]



def test_the_socket_is_corked_only_for_injections_that_take_several_writes(
        adapter, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    adapter_, peer = adapter
    corks: list[bool] = []
    monkeypatch.setattr("federation.daemon.broker._set_cork", lambda sock, on: corks.append(on) or True)
    writes: list[str] = []  # each of these puts its buffer on the socket with one write
    client = adapter_.client

    def counting(name: str) -> Any:
        real = getattr(client, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            writes.append(name)
            return real(*args, **kwargs)
        return counted

    for name in ("send_qos0", "send_reliable", "publish"):
        monkeypatch.setattr(client, name, counting(name))

    def injection(index: int, qos: int, retain: bool = False) -> Injection:
        return Injection(f"f/{index}", b"p%d" % index, qos, retain, None, (ORIGIN, 7, index), "f/#")

    reliable = [injection(index, 1) for index in range(10)]
    assert len(adapter_.injector.plan(reliable)) == 1
    adapter_.publish_all(reliable)
    assert corks == [] and writes == ["send_reliable"]  # one run, one write: no cork around it

    plain = [injection(index, 0) for index in range(10, 20)]
    assert len(adapter_.injector.plan(plain)) == 1
    adapter_.publish_all(plain)
    assert corks == [] and writes[1:] == ["send_qos0"]

    mixed = [injection(20, 0), injection(21, 1), injection(22, 0, retain=True)]
    assert len(adapter_.injector.plan(mixed)) == 3
    adapter_.publish_all(mixed)
    assert corks == [True, False] and writes[2:] == ["send_qos0", "send_reliable", "send_qos0"]  # corked together
    assert adapter_.injected == 23 and adapter_.inject_failed == 0
    assert read_all(peer).count(b"f/") == 23
