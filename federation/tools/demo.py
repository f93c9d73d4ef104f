"""`python -m federation.tools.demo` (`make demo`): a federation of real Mosquitto brokers on loopback, narrated.

Theory of operation: `federation.tools.launch.LocalFederation` starts N brokers
(default 5) on 127.0.0.10, .11, ... port 1883, each with its own wrapper on
port 10500, the wrappers linked in a ring, with the project's default
protocol settings. The demo then drives it with the real command-line
clients, `mosquitto_sub` and `mosquitto_pub`, exactly as a user would, and
explains each step from what the wrappers themselves report: their status
(asked over UDP, as `python wrapper.py status` does) and their JSON-lines
event logs. At the end it counts what each subscriber received, to show
that every publication arrived exactly once although the ring offers two
paths. It then keeps running, printing what the subscribers receive, until
Ctrl-C (or `--duration` seconds), and stops every process it started.
docs/demo.md explains the output.
"""

from __future__ import annotations

import argparse
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from federation.cli_version import add_version_option
from federation.daemon.keys import generate_key
from federation.tools.launch import (
    BROKER_PORT,
    FIRST_ADDRESS,
    LaunchError,
    LocalFederation,
    die_with_parent,
    find_mosquitto,
    node_names,
    poll,
    ring,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
PROG = "federation-demo"
"""the console script; `python -m federation.tools.demo` in a checkout"""
DEFAULT_NODES = 5
CONVERGE_TIMEOUT = 30.0
DELIVERY_TIMEOUT = 10.0


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Aligned columns, for the federation table and the tallies."""
    cells = [["-" if value is None else str(value) for value in row] for row in rows]
    widths = [max([len(header)] + [len(row[i]) for row in cells]) for i, header in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


@dataclass
class Subscriber:
    """A real `mosquitto_sub -v` on one broker; a thread turns its output lines into (topic, payload)."""

    name: str
    node: str
    host: str
    topic_filter: str
    process: subprocess.Popen[str]
    received: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, topic: str, payload: str) -> int:
        with self.lock:
            return sum(1 for item in self.received if item == (topic, payload))


class Demo:
    def __init__(self, count: int, workdir: Path, first_address: str) -> None:
        self.names = node_names(count)
        self.key_file = write_key(workdir / "federation.key")
        self.federation = LocalFederation(self.names, ring(self.names), workdir, first_address=first_address,
                                          key_file=self.key_file)
        self.subscribers: list[Subscriber] = []
        self.lines: queue.Queue[tuple[Subscriber, str, str]] = queue.Queue()
        self.started = time.monotonic()
        self.published: list[tuple[str, str, str, int]] = []
        """(publishing node, topic, payload, how many subscribers existed then)"""

    # ------------------------------------------------------------ output

    def say(self, text: str = "") -> None:
        stamp = f"[{time.monotonic() - self.started:6.2f}s]"
        for number, part in enumerate(text.splitlines() or [""]):
            print(f"{stamp if number == 0 else ' ' * len(stamp)} {part}", flush=True)

    def section(self, title: str) -> None:
        print(f"\n=== {title} ===", flush=True)

    def name_of(self, address: str | None) -> str:
        """n2 for "127.0.0.12:10500" or "3@127.0.0.12:10500"."""
        if address is None:
            return "-"
        host_port = address.split("@", 1)[-1]
        for name, node in self.federation.nodes.items():
            if node.address == host_port:
                return name
        return address

    # ------------------------------------------------------------ clients

    def subscribe(self, node: str, topic_filter: str) -> Subscriber:
        host = self.federation.node(node).host
        client_id = f"demo-sub-{node}-{len(self.subscribers) + 1}"
        command = [mosquitto_client("mosquitto_sub"), "-h", host, "-p", str(BROKER_PORT), "-i", client_id,
                   "-t", topic_filter, "-v"]
        self.say(f"$ mosquitto_sub -h {host} -i {client_id} -t '{topic_filter}' -v      (a client of broker {node})")
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, bufsize=1, process_group=0,
                                   preexec_fn=die_with_parent)
        subscriber = Subscriber(client_id, node, host, topic_filter, process)
        self.subscribers.append(subscriber)
        threading.Thread(target=self._read, args=(subscriber,), daemon=True).start()
        return subscriber

    def _read(self, subscriber: Subscriber) -> None:
        stream = subscriber.process.stdout
        assert stream is not None
        for raw in stream:
            topic, _, payload = raw.rstrip("\n").partition(" ")
            with subscriber.lock:
                subscriber.received.append((topic, payload))
            self.lines.put((subscriber, topic, payload))

    def publish(self, node: str, topic: str, payload: str) -> None:
        host = self.federation.node(node).host
        self.say(f"$ mosquitto_pub -h {host} -t {topic} -m {payload}      (a client of broker {node})")
        result = subprocess.run([mosquitto_client("mosquitto_pub"), "-h", host, "-p", str(BROKER_PORT),
                                 "-t", topic, "-m", payload],
                                capture_output=True, text=True, timeout=10, check=False)
        if result.returncode != 0:
            raise LaunchError(f"mosquitto_pub on {host} failed ({result.returncode}): {result.stderr.strip()}")
        self.published.append((node, topic, payload, len(self.subscribers)))

    def show_received(self, wait: float = 0.0) -> int:
        """Print subscriber lines as they come, for up to `wait` seconds after the last one; how many."""
        shown = 0
        deadline = time.monotonic() + wait
        while True:
            try:
                subscriber, topic, payload = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return shown
            self.say(f"    -> subscriber on {subscriber.node} ({subscriber.topic_filter}) received: {topic} {payload}")
            shown += 1

    def wait_received(self, subscribers: Sequence[Subscriber], topic: str, payload: str) -> float:
        """Wait until each subscriber got (topic, payload), printing lines meanwhile; seconds it took."""
        begun = time.monotonic()

        def arrived() -> bool:
            self.show_received(0.05)
            return all(s.count(topic, payload) > 0 for s in subscribers)

        poll(arrived, DELIVERY_TIMEOUT,
             f"{topic} {payload} to reach {', '.join(s.node for s in subscribers)}", interval=0.0)
        return time.monotonic() - begun

    # ------------------------------------------------------------ the story

    def run(self, duration: float | None) -> int:
        federation = self.federation
        count = len(self.names)
        last = self.names[-1]
        self.section(f"A federation of {count} real Mosquitto brokers on loopback, linked in a ring")
        ring_text = " - ".join(self.names) + f" - {self.names[0]}"
        self.say(f"Ring of wrappers: {ring_text}")
        self.say("Each node is one `mosquitto` (TCP 1883) plus one wrapper (`python wrapper.py`, UDP 10500) on its "
                 "own address.\nThe brokers are unmodified and know nothing of each other; the wrappers do the "
                 "federating.")
        self.say(f"Working directory (configs, broker logs, wrapper logs, event logs): {federation.workdir}")

        self.section("1. Starting the brokers")
        federation.start_brokers()
        for name, node in federation.nodes.items():
            self.say(f"{name}: mosquitto -c {node.broker_conf}   listening on {node.host}:{BROKER_PORT}")

        self.section("2. Starting the wrappers")
        self.say(f"$ python wrapper.py genkey > {self.key_file}   (one federation key, given to every wrapper: "
                 f"each datagram is signed\n  with it, and forged or replayed datagrams are dropped; "
                 f"docs/security.md)")
        begun = time.monotonic()
        federation.start_wrappers()
        for name, node in federation.nodes.items():
            neighbours = ", ".join(f"{n} ({federation.node(n).address})" for n in node.neighbours)
            self.say(f"{name}: wrapper.py --bind {node.address} --broker {node.host}:{BROKER_PORT} "
                     f"--id {federation.vids[name]} --key-file {self.key_file.name}\n    neighbours: {neighbours}")
        self.say(f"All {count} wrappers are connected to their brokers and read the brokers' "
                 f"$SYS/broker/log/# ({time.monotonic() - begun:.2f} s).")

        self.section("3. The overlay converges")
        statuses = federation.wait_converged(CONVERGE_TIMEOUT)
        self.say(f"Every wrapper knows all {count} members and they agree on one management core "
                 f"(seen {time.monotonic() - begun:.2f} s after the wrappers were started).")
        first = statuses[self.names[0]]
        core = first.get("management_core")
        self.say(f"Management core: {core} = {self.name_of(core)} (the lowest id wins the election).")
        self.say(f"Federation table of {self.names[0]} (from `python wrapper.py status --node "
                 f"{federation.node(self.names[0]).address}`):")
        rows = [[self.name_of(m.get("address")), m.get("address"), m.get("id"), m.get("distance"),
                 ", ".join(self.name_of(h) for h in m.get("next_hops", [])) or "(itself)"]
                for m in first.get("federation", [])]
        self.say(table(["node", "address", "id", "hops", "next hops"], rows))
        both_ways = [self.name_of(m.get("address")) for m in first.get("federation", [])
                     if len(m.get("next_hops", [])) > 1]
        if both_ways:
            self.say(f"Two next hops toward {', '.join(both_ways)}: both ways round the ring are shortest paths.")
        else:
            self.say("One next hop per member: the shorter way round the ring; the other way is the detour the "
                     "table switches to if a link or a wrapper fails.")

        self.section("4. A subscriber, and the federation elects a topic core")
        exact_filter = "home/+/temperature"
        exact = self.subscribe("n2", exact_filter)
        federation.wait_mesh(exact_filter, CONVERGE_TIMEOUT)
        row = next(t for t in federation.status("n2")["topics"] if t["filter"] == exact_filter)
        self.say(f"The wrapper of n2 saw the SUBSCRIBE in its broker's log and claimed the topic core of "
                 f"'{exact_filter}':\n    core {row['core']} = {self.name_of(row['core'])}; all {count} wrappers "
                 f"agree, and publications for it now flow toward {self.name_of(row['core'])}.")

        self.section("5. A publication on another broker")
        self.publish("n0", "home/kitchen/temperature", "21.5")
        took = self.wait_received([exact], "home/kitchen/temperature", "21.5")
        self.say(f"Delivered by n0's wrapper to n2's broker in {took * 1000:.0f} ms (mosquitto_pub included).")
        self.explain_path("n2", "home/kitchen/temperature")

        self.section("6. A wildcard subscriber on a third broker, and more publications")
        wild_filter = "home/#"
        wild = self.subscribe(last, wild_filter)
        federation.wait_mesh(wild_filter, CONVERGE_TIMEOUT)
        row = next(t for t in federation.status(last)["topics"] if t["filter"] == wild_filter)
        self.say(f"Topic core of '{wild_filter}': {self.name_of(row['core'])}.")
        batch = [("n1", "home/garage/temperature", "17.0", [exact, wild]),
                 ("n3", "home/garden/humidity", "80", [wild]),
                 ("n0", "home/kitchen/temperature", "21.7", [exact, wild]),
                 (last, "home/living/temperature", "20.5", [exact, wild])]
        for publisher, topic, payload, expected in batch:
            self.publish(publisher, topic, payload)
            self.wait_received(expected, topic, payload)
        self.show_received(1.0)  # anything late (a duplicate would show here)
        self.tally()

        self.section("7. Running")
        addresses = ", ".join(f"{name}={node.host}" for name, node in federation.nodes.items())
        self.say(f"The federation keeps running: brokers {addresses} (port {BROKER_PORT}).\nTry, in another "
                 f"terminal:\n    mosquitto_pub -h {federation.node('n1').host} -t home/office/temperature -m 19\n"
                 f"    mosquitto_sub -h {federation.node('n3').host} -t 'home/#' -v\n"
                 f"    python wrapper.py status --node {federation.node('n0').address}\n"
                 f"    python examples/python_client.py\n"
                 f"Messages the demo's subscribers receive are printed below. "
                 + ("Ctrl-C stops everything." if duration is None else f"Stopping after {duration:g} s."))
        deadline = None if duration is None else time.monotonic() + duration
        while deadline is None or time.monotonic() < deadline:
            self.show_received(0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic())))
            for subscriber in self.subscribers:
                if subscriber.process.poll() is not None:
                    raise LaunchError(f"the subscriber on {subscriber.node} exited "
                                      f"({subscriber.process.returncode})")
        return EXIT_OK

    def explain_path(self, receiver: str, topic: str) -> None:
        """Print the path of the last publication on `topic` from the event logs (flushed about every second)."""
        def delivered() -> dict[str, Any] | None:
            found = [e for e in self.federation.events(receiver, ["publication_delivered"]) if e.get("topic") == topic]
            return found[-1] if found else None

        try:
            event = poll(delivered, 5.0, "the delivery event", interval=0.1)
        except LaunchError:
            self.say("(the event logs have not been flushed yet; see events.jsonl in each node's directory)")
            return
        publication = event.get("pub")
        hops: list[str] = []
        for name in self.names:
            for entry in self.federation.events(name, ["publication_forwarded"]):
                if entry.get("pub") == publication:
                    hops.append(f"{name} -> {', '.join(self.name_of(t) for t in entry.get('to', []))}")
        self.say(f"Its trace in the wrappers' event logs: publication {publication}\n    forwarded: "
                 f"{'; '.join(hops) or '-'}\n    delivered at {receiver} after {event.get('hops')} hops")

    def tally(self) -> None:
        """How many times each subscriber received each publication: 1 where it matches, 0 elsewhere."""
        from federation.protocol.topic_filter import matches

        rows = []
        wrong = 0
        for node, topic, payload, existing in self.published:
            cells: list[Any] = [node, f"{topic} {payload}"]
            for position, subscriber in enumerate(self.subscribers):
                got = subscriber.count(topic, payload)
                if position >= existing:
                    cells.append(f"{got} (not yet subscribed)")
                    continue
                wrong += got != (1 if matches(subscriber.topic_filter, topic) else 0)
                cells.append(got)
            rows.append(cells)
        headers = ["from", "publication", *(f"sub {s.node} {s.topic_filter}" for s in self.subscribers)]
        self.say("Copies received by each subscriber:\n" + table(headers, rows))
        duplicates = sum(len(self.federation.events(name, ["duplicate_dropped"])) for name in self.names)
        if wrong == 0:
            self.say("Each publication arrived exactly once at each subscriber whose filter matches it, and "
                     "nowhere else,\nalthough the ring has two paths between any two brokers (bridges in a ring "
                     "would loop forever).\nPublications follow each filter's mesh, not the ring, and a wrapper "
                     "that gets a second copy (redundant parents,\nrepairs) drops it: duplicate_dropped events "
                     f"in the wrappers' logs so far: {duplicates}.")
        else:
            self.say(f"!!! {wrong} unexpected counts above: this is a bug; the logs are in {self.federation.workdir}")

    def stop(self) -> None:
        for subscriber in self.subscribers:
            if subscriber.process.poll() is None:
                subscriber.process.terminate()
            try:
                subscriber.process.wait(5)
            except subprocess.TimeoutExpired:
                subscriber.process.kill()
                subscriber.process.wait()
        self.federation.stop()


def write_key(path: Path) -> Path:
    """A new federation key in `path` (readable by its owner only), as `wrapper.py genkey > PATH` makes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(generate_key() + "\n")
    return path


def mosquitto_client(name: str) -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found is None:
        raise LaunchError(f"{name} is not installed: run `make install` (or `apt-get install -y mosquitto-clients`)")
    return found


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Start a ring of real Mosquitto brokers with federation wrappers on 127.0.0.x, show "
                    "publications crossing it exactly once, and keep it running until Ctrl-C. See docs/demo.md "
                    "(in a checkout also `python -m federation.tools.demo`).")
    add_version_option(parser, PROG)
    parser.add_argument("--nodes", type=int, default=DEFAULT_NODES, help=f"brokers in the ring, at least 4 "
                                                                         f"(default {DEFAULT_NODES})")
    parser.add_argument("--duration", type=float, metavar="N",
                        help="stop by itself N seconds after the scripted part (default: run until Ctrl-C)")
    parser.add_argument("--workdir", type=Path, help="directory for configs and logs (default: a new one in /tmp)")
    parser.add_argument("--first-address", default=FIRST_ADDRESS,
                        help=f"address of the first broker; the others follow (default {FIRST_ADDRESS})")
    options = parser.parse_args(argv)
    if not 4 <= options.nodes <= 200:
        print(f"{PROG}: error: --nodes must be from 4 to 200", file=sys.stderr)
        return EXIT_USAGE
    if options.duration is not None and options.duration < 0:
        print(f"{PROG}: error: --duration must be 0 or more seconds", file=sys.stderr)
        return EXIT_USAGE
    try:
        find_mosquitto()
        mosquitto_client("mosquitto_sub")
        mosquitto_client("mosquitto_pub")
    except LaunchError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="federation-demo-"))
    try:
        demo = Demo(options.nodes, workdir, options.first_address)
        demo.federation.check_addresses_free()
    except (LaunchError, ValueError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    previous = signal.signal(signal.SIGTERM, _terminate)
    status = EXIT_OK
    try:
        status = demo.run(options.duration)
    except KeyboardInterrupt:
        print(flush=True)
        demo.say("Interrupted.")
    except LaunchError as error:
        demo.say(f"{PROG}: error: {error}")
        status = EXIT_FAILED
    finally:
        demo.section("Stopping")
        demo.say(f"Stopping {len(demo.subscribers)} subscribers, {options.nodes} wrappers (they leave the overlay "
                 f"cleanly) and {options.nodes} brokers...")
        demo.stop()
        signal.signal(signal.SIGTERM, previous)
        left = [f"{kind} of {name}" for name, node in demo.federation.nodes.items()
                for kind, running in (("broker", node.broker_running), ("wrapper", node.wrapper_running)) if running]
        if left:
            demo.say(f"!!! still running: {', '.join(left)}")
            status = EXIT_FAILED
        else:
            demo.say(f"Everything the demo started has stopped (check: pgrep -a mosquitto). Logs: {workdir}")
    return status


if __name__ == "__main__":
    sys.exit(main())
