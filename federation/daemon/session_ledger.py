"""Which MQTT 5 sessions the broker kept when their connection ended, from counts it publishes (issue 39, item 1).

Theory of operation
-------------------
In MQTT 5 a session outlives its connection when it has a Session Expiry Interval, whatever its first CONNECT's
clean start: clean start 1 with an expiry (paho's default `clean_start=FIRST_ONLY`, MQTT.js `clean: true` with
`sessionExpiryInterval`) is a persistent session, and the broker queues QoS 1/2 messages for it while it is
offline. Mosquitto 2.0.11's log says `(p5, c1, ...)` for it, and nothing about the expiry: a wrapper that took `c1`
for "the filters end with the connection" dropped them, and the client came back to nothing (0 of 10 queued
messages, measured). Session present, the other half, is not logged either.

So the wrapper keeps a v5 client's filters when its connection ends (`sessions.unsure`: over-delivery at worst,
never a loss), and settles its session's fate from two counts Mosquitto publishes on `$SYS` once per
`sys_interval` round, when they changed: `$SYS/broker/clients/total` (the sessions it holds, connected or not:
one per client id) and `$SYS/broker/subscriptions/count` (every subscription of them, shared ones aside). The
wrapper reads them at QoS 1, as it reads the log, so they reach it in the broker's order with the log lines: a
round (`$SYS/broker/uptime` first, then the counts that changed) counts exactly what the log lines before it
did. Between two rounds every logged event has a known effect on both counts (a new client id +1, a takeover 0,
a session expiry -1 and its filters, a subscribe of a new filter +1...) except each unsure session's fate: kept
(0) or ended (-1 client, minus its filters). `SessionLedger.round_ended` tries every fate for the unsure
sessions of the window (at most `MAX_UNKNOWNS`); when exactly one assignment gives both counts, the fates are
settled: an ended session's filters go (`Resolution.ended`), a kept one is confirmed. When none or several do,
nothing is decided and the filters stay (`undecided`, counted); the round's equation is kept, and when a later
event settles one of its sessions (it comes back, or expires) the others may follow from it (two sessions with
one filter each, one of which ended, are told apart when one of them reconnects).

A reconnection with clean start 0 of a session whose fate was not settled settles it the same way: a session
the broker no longer had makes its client id count +1 again (session present 0), and the filters the wrapper
carried from before are dropped (`Resolution.absent`); the client subscribes again if it needs them.

What can still mislead it (docs/daemon.md "Persistent sessions"): the broker ends a session silently only when a
v5 client with a Will Delay Interval and no session expiry has its will published after the delay (Mosquitto
keeps its session until then); if that happens in the same round as an unsure disconnection with the same number
of filters, the two counts cannot tell which ended. A client id that connects for the first time while the
broker holds sessions the wrapper never saw (before it started, or while it was away from the log) may be one of
them: until the broker's `$SYS/broker/clients/disconnected` shows no session the wrapper does not know
(`calibrated`), such a connection is one more unknown, and decides nothing on its own.

Sans-I/O: the runtime feeds the log's events and the counts in the order read, and applies the resolutions.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

MAX_UNKNOWNS = 12
"""unsure sessions (and unknown reconnections) one round may settle at once; beyond, nothing is decided"""
MAX_EQUATIONS = 64
"""undecided rounds kept for later settling (`SessionLedger._settled`); the oldest go first"""


class Fate(Enum):
    KEPT = "kept"
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a round settled for one client id: `ended` its offline session ended (its filters go); `absent` the
    session it reconnected to was new (session present 0: the filters carried from before go); otherwise its
    session was kept (nothing changes)."""

    client: str
    ended: bool = False
    absent: bool = False


@dataclass
class _Offline:
    filters: int
    """the filters Mosquitto counts that the wrapper knows for it"""
    complete: bool
    """the wrapper knows every filter of the session (it saw it start clean)"""
    unsure: bool
    """its fate is not settled (a v5 session whose connection ended)"""


@dataclass
class _Window:
    """The events between two rounds: the known effects, and the unknown ones by client id."""

    clients: int = 0
    subscriptions: int = 0
    subscriptions_known: bool = True
    unknown: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    """client id -> (clients, subscriptions) effect if its session ended (not kept), per event"""
    unknown_new: list[str] = field(default_factory=list)
    """client ids connecting whose earlier session the broker may hold (not `calibrated`)"""


@dataclass
class LedgerCounts:
    rounds: int = 0
    """rounds of $SYS counts read"""
    rounds_started: int = 0
    """rounds begun (a round is counted in `rounds` when the next log line or round shows it complete)"""
    decided: int = 0
    """rounds that settled at least one unsure session"""
    undecided: int = 0
    """rounds with unsure sessions that no single assignment explained: their filters stay (over-delivery)"""
    ended: int = 0
    """offline sessions found ended (their filters dropped)"""
    kept: int = 0
    """offline sessions found kept"""
    absent: int = 0
    """reconnections found to a session the broker no longer had (session present 0)"""
    assumed_kept: int = 0
    """v5 sessions whose connection ended, taken as kept until settled (the safe side)"""


class SessionLedger:
    """The broker's sessions as the log and the $SYS counts show them (module docstring)."""

    def __init__(self) -> None:
        self.connected: dict[str, bool] = {}
        """client id -> the wrapper knows every filter of its session (it connected clean, or resumed a complete
        one)"""
        self.offline: dict[str, _Offline] = {}
        self.total: int | None = None
        self.subscriptions: int | None = None
        self.disconnected: int | None = None
        self.calibrated = False
        """no offline session exists that the wrapper does not know of (`$SYS/broker/clients/disconnected`)"""
        self.counts = LedgerCounts()
        self.last_undecided: str | None = None
        """why the last undecided round decided nothing (status)"""
        self._equations: list[tuple[dict[str, list[tuple[int, int]]], int, int | None]] = []
        """undecided rounds: (what each unsure session's end adds, the client count left to explain, the
        subscription count left, None when unknown), kept until their sessions settle (at most `MAX_EQUATIONS`)"""
        self._window = _Window()
        self._skip = 0
        """rounds that only set the counts to compare with (`unsettle`)"""
        self._kickers: dict[str, tuple[bool, int, int]] = {}
        """client id -> (it resumed an unsure session, the client's filters, those it took over if resumed) of a
        takeover connection under way"""
        self._late: dict[str, Fate] = {}
        """fates learnt between rounds (an expiry proves a session was kept), for the undecided rounds kept"""
        self._round: tuple[int | None, int | None] | None = None
        """a round under way: (total, subscriptions) read since its uptime (None: unchanged)"""

    # ------------------------------------------------------------ the log's events, in order

    def connected_line(self, client: str, clean: bool, filters_before: int) -> None:
        """`client` connected; `filters_before`: the filters the wrapper held for it (what a clean start drops)."""
        window = self._window
        offline = self.offline.pop(client, None)
        if client in self.connected:  # a takeover (its own line said so): the session goes on or starts anew
            if clean:
                window.subscriptions -= filters_before
                if not self.connected[client]:
                    window.subscriptions_known = False
        elif offline is None:
            if self.calibrated:
                window.clients += 1
            else:
                window.unknown_new.append(client)
                if clean:
                    window.subscriptions_known = False  # a session it may have had: its filters go uncounted
        elif offline.unsure:
            # kept: it resumes (c0) or is replaced (c1, its filters go); ended: one client id more
            # (the unknown's entries are what an ended session adds to what a kept one does)
            window.unknown.setdefault(client, []).append((1, 0))
            if clean:  # kept: its filters go now; ended: they went at its end (counted there)
                window.unknown[client].append((0, offline.filters))
                window.subscriptions -= offline.filters
        elif clean:  # a kept session replaced
            window.subscriptions -= offline.filters
            if not offline.complete:
                window.subscriptions_known = False
        self.connected[client] = clean or (offline is not None and offline.complete and not offline.unsure)

    def gone_line(self, client: str, protocol: int | None, clean: bool | None, takeover: bool,
                  filters: int) -> None:
        """A connection of `client` ended (not an expiry); `filters`: the counted filters the wrapper holds for it."""
        window = self._window
        complete = self.connected.pop(client, False)
        if takeover:
            self.connected[client] = complete  # the connection that took over is logged next
            return
        if protocol is not None and protocol < 5:
            if clean:
                window.clients -= 1
                window.subscriptions -= filters
                if not complete:
                    window.subscriptions_known = False
            else:
                self.offline[client] = _Offline(filters, complete, unsure=False)
            return
        # MQTT 5 (or not seen connecting): kept or ended, the log does not say
        self.offline[client] = _Offline(filters, complete, unsure=True)
        window.unknown.setdefault(client, []).append((-1, -filters))
        if not complete:
            window.subscriptions_known = False
        self.counts.assumed_kept += 1

    def kicker_connected(self, client: str, clean: bool, filters: int) -> None:
        """The wrapper's own connection took `client` over (federation.daemon.kicker): a CONNECT with its id, with
        the effects of one (`connected_line`); `filters`: those the wrapper held for it."""
        offline = self.offline.get(client)
        unsure = offline is not None and offline.unsure
        taken = 0 if clean or (offline is None and client not in self.connected) else filters
        self._kickers[client] = (unsure and not clean, filters, taken)
        self.connected_line(client, clean, filters)

    def kicker_gone(self, client: str, own_subscriptions: int) -> None:
        """The takeover connection ended, and the session with it (its expiry is 0): the subscriptions it held go
        (the client's, resumed with clean start 0, and its own fence)."""
        resumed_unsure, filters, taken = self._kickers.pop(client, (False, 0, 0))
        window = self._window
        window.clients -= 1
        window.subscriptions -= taken + own_subscriptions
        if resumed_unsure:  # had the session ended before, it took over no subscription: that much less goes
            window.unknown.setdefault(client, []).append((0, filters))
        self.connected.pop(client, None)
        self.offline.pop(client, None)

    def expired_line(self, client: str, filters: int) -> None:
        """"Expiring client X": its offline session ended."""
        window = self._window
        offline = self.offline.pop(client, None)
        window.unknown.pop(client, None)  # it was kept until now, whatever its end in this window looked like
        if offline is not None and offline.unsure:
            self._late[client] = Fate.KEPT
        window.clients -= 1
        window.subscriptions -= filters
        if offline is None or not offline.complete:
            window.subscriptions_known = False

    def subscription_changed(self, effect: int | None) -> None:
        """A subscribe or unsubscribe line: +1, -1 or 0 on the broker's count, None when the wrapper cannot tell
        (a client whose filters it does not all know)."""
        if effect is None:
            self._window.subscriptions_known = False
        else:
            self._window.subscriptions += effect

    def helper(self, clients: int = 0, subscriptions: int = 0) -> None:
        """One of the wrapper's own connections (the retained scan) came or went, or subscribed."""
        self._window.clients += clients
        self._window.subscriptions += subscriptions

    def unsettle(self) -> None:
        """The wrapper (re)subscribed to the counts: lines may have been lost (it was away from the log, the broker
        restarted), and the first counts it gets are the broker's retained ones, of the last round before it
        subscribed, followed by lines it saw only in part. So the next two rounds (that retained one, then a whole
        one) only set the counts to compare with; sessions stay as they are (unsure ones unsure)."""
        self._window = _Window(subscriptions_known=False)
        self.total = self.subscriptions = None
        self._round = None
        self._skip = 2

    def broker_restarted(self) -> None:
        """The broker came back without the wrapper's session: it holds no session of before (persistence off)."""
        self.connected.clear()
        self.offline.clear()
        self.unsettle()

    # ------------------------------------------------------------ the $SYS counts, in order

    def round_started(self) -> list[Resolution]:
        """`$SYS/broker/uptime`: a round of counts begins (the one before ends)."""
        resolutions = self.round_ended()
        self._round = (None, None)
        self.counts.rounds_started += 1
        return resolutions

    def total_counted(self, total: int) -> None:
        if self._round is None:
            self.total = total  # its retained value at subscribe time, or outside a round: a new reference
            return
        self._round = (total, self._round[1])

    def subscriptions_counted(self, count: int) -> None:
        if self._round is None:
            self.subscriptions = count
            return
        self._round = (self._round[0], count)

    def disconnected_counted(self, count: int) -> None:
        """`$SYS/broker/clients/disconnected`: sessions without a connection. When it is not above the offline
        sessions the wrapper knows, none is hidden from it (a connection not yet through CONNECT lowers it too:
        the module docstring)."""
        self.disconnected = count
        self.calibrated = count <= len(self.offline)

    def round_ended(self) -> list[Resolution]:
        """A round's counts are all in (the next log line or round came): settle what they explain."""
        if self._round is None:
            return []
        total_now, subscriptions_now = self._round
        self._round = None
        window, self._window = self._window, _Window()
        self.counts.rounds += 1
        total = total_now if total_now is not None else self.total
        subscriptions = subscriptions_now if subscriptions_now is not None else self.subscriptions
        before_total, before_subscriptions = self.total, self.subscriptions
        self.total, self.subscriptions = total, subscriptions
        late, self._late = self._late, {}
        if self._skip:
            self._skip -= 1
            return self._apply(late) if late else []
        if not window.unknown:
            return self._apply(late) if late else []
        if total is None or before_total is None or window.unknown_new:
            self.counts.undecided += 1
            self.last_undecided = (f"{sorted(window.unknown)}: the client count before or now not known, or "
                                   f"{len(window.unknown_new)} first connections of ids the broker may hold")
            return self._apply(late) if late else []
        subscriptions_known = window.subscriptions_known and subscriptions is not None \
            and before_subscriptions is not None
        clients_left = total - before_total - window.clients
        subscriptions_left = (subscriptions - before_subscriptions - window.subscriptions) \
            if subscriptions_known and subscriptions is not None and before_subscriptions is not None else None
        fates = _solve(window.unknown, clients_left, subscriptions_left)
        if fates is None:
            self.counts.undecided += 1
            self.last_undecided = (f"{sorted(window.unknown)}: {window.unknown} to explain clients "
                                   f"{total - before_total} (known {window.clients}), subscriptions "
                                   f"{'?' if subscriptions_left is None else subscriptions_left + window.subscriptions}"
                                   f" (known {window.subscriptions})")
            self._equations.append((dict(window.unknown), clients_left, subscriptions_left))
            del self._equations[:-MAX_EQUATIONS]
            return self._apply(late) if late else []
        self.counts.decided += 1
        return self._apply({**late, **fates})

    def _settled(self, fates: dict[str, Fate]) -> dict[str, Fate]:
        """Fates settled elsewhere, put into the undecided rounds kept: those they now decide, settled in turn."""
        found: dict[str, Fate] = {}
        pending = dict(fates)
        while pending:
            client, fate = pending.popitem()
            kept: list[tuple[dict[str, list[tuple[int, int]]], int, int | None]] = []
            for unknown, clients, subscriptions in self._equations:
                if client in unknown:
                    effects = unknown.pop(client)
                    if fate is Fate.ENDED:
                        clients -= sum(effect[0] for effect in effects)
                        if subscriptions is not None:
                            subscriptions -= sum(effect[1] for effect in effects)
                    solved = _solve(unknown, clients, subscriptions) if unknown else None
                    if solved is not None:
                        for other, other_fate in solved.items():
                            if other not in found and other not in fates:
                                found[other] = other_fate
                                pending[other] = other_fate
                        continue
                if unknown:
                    kept.append((unknown, clients, subscriptions))
            self._equations = kept
        return found
    def _apply(self, fates: dict[str, Fate]) -> list[Resolution]:
        fates = {**fates, **self._settled(fates)}
        resolutions: list[Resolution] = []
        for client, fate in sorted(fates.items()):
            offline = self.offline.get(client)
            if client in self.connected:  # it reconnected within the window
                if fate is Fate.ENDED:
                    self.counts.absent += 1
                    resolutions.append(Resolution(client, absent=True))
                else:
                    self.counts.kept += 1
                    resolutions.append(Resolution(client))
                continue
            if offline is None:
                continue
            if fate is Fate.ENDED:
                del self.offline[client]
                self.counts.ended += 1
                resolutions.append(Resolution(client, ended=True))
            else:
                offline.unsure = False
                self.counts.kept += 1
                resolutions.append(Resolution(client))
        return resolutions

    # ------------------------------------------------------------ read-outs

    def unsure(self) -> Iterable[str]:
        return (client for client, offline in self.offline.items() if offline.unsure)

    def describe(self) -> dict[str, object]:
        counts = self.counts
        return {"following": self._skip == 0 and self.total is not None,
                "unsure": sum(1 for _ in self.unsure()),
                "kept": sum(1 for offline in self.offline.values() if not offline.unsure),
                "calibrated": self.calibrated, "clients_total": self.total,
                "rounds": counts.rounds, "started": counts.rounds_started, "decided": counts.decided,
                "undecided": counts.undecided,
                "ended": counts.ended, "confirmed_kept": counts.kept, "absent": counts.absent,
                "assumed_kept": counts.assumed_kept, "last_undecided": self.last_undecided}


def _solve(unknown: dict[str, list[tuple[int, int]]], clients: int,
           subscriptions: int | None) -> dict[str, Fate] | None:
    """The one assignment of fates to the unsure sessions whose ends (`unknown`: what each end adds to both counts)
    account for `clients` and `subscriptions` (None: the subscription count is not known), or None."""
    names = sorted(unknown)
    if len(names) > MAX_UNKNOWNS:
        return None
    found: dict[str, Fate] | None = None
    for ended in itertools.product((False, True), repeat=len(names)):
        effects = [effect for name, end in zip(names, ended, strict=True) if end for effect in unknown[name]]
        if sum(effect[0] for effect in effects) != clients:
            continue
        if subscriptions is not None:
            if sum(effect[1] for effect in effects) != subscriptions:
                continue
        elif any(ended):
            # Without the subscription count an ended session is not trusted (a silent end elsewhere or a hidden
            # session could make the client count fit): only "all kept" may be concluded.
            continue
        if found is not None:
            return None  # two explanations: nothing is decided
        found = {name: Fate.ENDED if end else Fate.KEPT for name, end in zip(names, ended, strict=True)}
    return found
