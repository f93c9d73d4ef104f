"""The event log: one JSON line per event (docs/protocol.md "Events"), appended to a file.

Theory of operation: a wrapper writes a line per run of publications at each
stage (`publications_originated` and `publications_forwarded` where they are
published, `publications_delivered` where they arrive: schema version 2), and
other events as they happen, so encoding is on the data path. The schema is a
contract (the Spark job, federation/spark/, replays these files), so the fast path must give exactly
the bytes of `json.JSONEncoder(separators=(",", ":"), default=str)
.encode(event.to_json_dict())`; tests/protocol/test_hotpath_node.py compares them.

It writes lines from a template instead of walking a dict. Every event of a
kind comes from a few call sites with the same node and the same field names
in the same order, so the constant text (`{"v":2,"t":`, node, type, the
quoted field names) is made once per (node, type, field names) into a
`%`-template and only the values are encoded per line: strings with the
json module's C quoting, integers and booleans directly, lists of strings
(next hops, matching filters, which repeat) from a small cache. Events
drained together share one time object, so the rounded time's text is
remembered for the last time seen. Anything else (floats, maps, reserved or
non-string field names, a time that is not a finite float) goes to the json
encoder, whole event or one value, which gives the same bytes by
construction. Caches are bounded: they are cleared when full.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from json.encoder import encode_basestring_ascii as _json_text
from pathlib import Path
from typing import IO, Any

from federation.protocol.types import EVENT_SCHEMA_VERSION, Event

log = logging.getLogger("federation.daemon")

EVENT_LOG_BUFFER = 1 << 20
"""bytes buffered before the event log is written without waiting for the flush"""
CACHE_LIMIT = 1024
"""entries in each encoding cache (templates, list texts) before it is cleared"""

_EVENT_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)
_RESERVED_KEYS = frozenset(("v", "t", "node", "type"))
_NO_TIME = object()


class EventLogError(Exception):
    """The event log file cannot be opened; the message says which file and what to do."""


class EventEncoder:
    """Event -> JSON line (no newline), byte-identical to the json encoder; see the module docstring."""

    __slots__ = ("_last_time", "_templates", "_list_texts")

    def __init__(self) -> None:
        self._last_time: tuple[object, str] = (_NO_TIME, "")
        """(the last event time object seen, its rounded text); one tuple, so it is replaced at once"""
        self._templates: dict[tuple[Any, ...], str] = {}
        """(node, type, *field names) -> the line with `%s` for the time and each value"""
        self._list_texts: dict[tuple[Any, ...], str] = {}
        """a list of strings as a tuple -> its JSON text"""

    def encode(self, event: Event) -> str:
        time = event.time
        last_time, time_text = self._last_time
        if time is not last_time:
            rounded = round(time, 6)
            if type(rounded) is not float or rounded - rounded != 0.0:  # an int, an inf or a nan
                return _EVENT_ENCODER.encode(event.to_json_dict())
            time_text = float.__repr__(rounded)
            self._last_time = (time, time_text)
        fields = event.fields
        try:
            template = self._templates.get((event.node, event.type, *fields))
        except TypeError:  # an unhashable node or type
            return _EVENT_ENCODER.encode(event.to_json_dict())
        if template is None:
            template = self._template(event)
            if template is None:
                return _EVENT_ENCODER.encode(event.to_json_dict())
        values = [time_text]
        append = values.append
        for value in fields.values():
            kind = type(value)
            if kind is str:
                append(_json_text(value))
            elif kind is int:
                append(int.__repr__(value))
            elif kind is bool:
                append("true" if value else "false")
            elif value is None:
                append("null")
            elif kind is list:
                append(self._pairs_text(value) if value and type(value[0]) is list else self._list_text(value))
            else:
                append(_EVENT_ENCODER.encode(value))
        return template % tuple(values)

    def _template(self, event: Event) -> str | None:
        """The `%`-template for this event's node, type and field names; None if the json encoder must do it."""
        node, kind, fields = event.node, event.type, event.fields
        if type(node) is not str or type(kind) is not str:
            return None
        if any(type(key) is not str or key in _RESERVED_KEYS for key in fields):
            return None  # a reserved name replaces the header's value; other names are converted
        constants = [f'{{"v":{EVENT_SCHEMA_VERSION},"t":', f',"node":{_json_text(node)},"type":{_json_text(kind)}']
        for key in fields:
            constants[-1] += f",{_json_text(key)}:"
            constants.append("")
        constants[-1] += "}"
        template = "%s".join(constant.replace("%", "%%") for constant in constants)  # a `%` in a name stays one
        if len(self._templates) >= CACHE_LIMIT:
            self._templates.clear()
        self._templates[(node, kind, *fields)] = template
        return template

    @staticmethod
    def _pairs_text(items: list[Any]) -> str:
        """A list of [int, int] pairs (a run's `seqs`, written for every run event), as the json encoder writes it."""
        try:
            if all(type(pair) is list and len(pair) == 2 and type(pair[0]) is int and type(pair[1]) is int
                   for pair in items):
                return "[" + ",".join([f"[{first},{last}]" for first, last in items]) + "]"
        except TypeError:
            pass
        return _EVENT_ENCODER.encode(items)

    def _list_text(self, items: list[Any]) -> str:
        key = tuple(items)
        try:
            text = self._list_texts.get(key)
        except TypeError:  # an unhashable element: not a list of strings
            return _EVENT_ENCODER.encode(items)
        if text is not None:
            return text
        try:
            text = "[" + ",".join(map(_json_text, items)) + "]"
        except TypeError:  # not all strings
            return _EVENT_ENCODER.encode(items)
        if len(self._list_texts) >= CACHE_LIMIT:
            self._list_texts.clear()
        self._list_texts[key] = text
        return text


encode_event = EventEncoder().encode
"""One event's JSON line (no newline): exactly `_EVENT_ENCODER.encode(event.to_json_dict())`."""


class EventLog:
    """JSON-lines event trace: buffered appends, flushed by the runtime every second and at close; `reopen` (the
    daemon's SIGHUP, after logrotate renamed the file) goes on in a new file at the same path."""

    def __init__(self, path: Path, types: frozenset[str] | None) -> None:
        self.path = path
        self.types = types
        self.lines = 0
        self.errors = 0
        self.reopened = 0
        """times the file was reopened at its path"""
        self._file: IO[str] | None = self._open()

    def _open(self) -> IO[str]:
        path = self.path
        try:
            if path.parent != Path(""):
                path.parent.mkdir(parents=True, exist_ok=True)
            return open(path, "a", encoding="utf-8", buffering=EVENT_LOG_BUFFER)  # noqa: SIM115
        except OSError as error:
            raise EventLogError(f"--event-log: cannot open {str(path)!r} for appending: {error.strerror or error}; "
                                f"give a writable file path") from None

    def reopen(self) -> None:
        """Write what is buffered to the file open now, then go on in the file at `path` (created if it was
        renamed away). EventLogError if it cannot be opened: the old file is kept then, and written on."""
        if self._file is None:
            return
        fresh = self._open()
        old, self._file = self._file, fresh
        try:
            old.flush()
            old.close()
        except OSError as error:
            self._failed(error)
        self.reopened += 1

    def write(self, batch: Iterable[Event]) -> None:
        if self._file is None:
            return
        types = self.types
        if types is None:
            lines = [encode_event(event) for event in batch]
        else:
            lines = [encode_event(event) for event in batch if event.type in types]
        if not lines:
            return
        count = len(lines)
        lines.append("")
        try:
            self._file.write("\n".join(lines))
        except OSError as error:
            self._failed(error)
            return
        self.lines += count

    def _failed(self, error: OSError) -> None:
        self.errors += 1
        if self.errors == 1 or self.errors % 1000 == 0:
            log.error("cannot write the event log %s: %s (%d failures so far)", self.path, error, self.errors)

    def flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as error:
                self._failed(error)

    def close(self) -> None:
        if self._file is not None:
            self.flush()
            try:
                self._file.close()
            except OSError as error:
                self._failed(error)
            self._file = None
