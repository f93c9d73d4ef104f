"""Checked readers of one packet field: its type and range, and topics and filters that are valid.

Each returns the value as it is when it is what docs/protocol.md allows
there, and raises DecodeError (a short reason and the field's name) when
it is not; the decoder (federation.protocol.wire_decode) builds packets
from them. Topics and filters repeat in every data packet, so the ones
found valid lately are remembered (a pure memo, bounded).
"""

from __future__ import annotations

import math
from typing import Any

from federation.protocol.topic_filter import (
    REPAIR_PREFIX,
    SHARE_PREFIX,
    federated_filter,
    split_repair,
    validate_filter,
    validate_topic,
)
from federation.protocol.types import Address, BrokerId
from federation.protocol.wire_constants import MAX_EPOCH, MAX_SEQ, MAX_TEXT, MAX_U64, DecodeError


def checked_int(value: Any, what: str, low: int = 0, high: int = MAX_U64) -> int:
    if type(value) is not int:
        raise DecodeError("wrong_type", f"{what}: expected an integer in [{low}, {high}]")
    if not low <= value <= high:
        raise DecodeError("out_of_range", f"{what}: {value} is not in [{low}, {high}]")
    return value


def checked_epoch(value: Any, what: str) -> int:
    return checked_int(value, what, 0, MAX_EPOCH)


def checked_seq(value: Any, what: str) -> int:
    return checked_int(value, what, 0, MAX_SEQ)


def checked_float(value: Any, what: str, high: float) -> float:
    """A number in [0, high]: finite (no NaN, no infinity)."""
    if type(value) not in (int, float) or math.isnan(value):  # NaN is not a time
        raise DecodeError("wrong_type", f"{what}: expected a number")
    if not 0 <= value <= high:
        raise DecodeError("out_of_range", f"{what}: {value} is not in [0, {high:g}]")
    return float(value)


def checked_text(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    if type(value) is not str or len(value) > limit:
        raise DecodeError("wrong_type", f"{what}: expected a string of at most {limit} characters")
    return value


def checked_list(value: Any, what: str, length: int | None = None) -> list[Any]:
    if type(value) is not list or (length is not None and len(value) != length):
        expected = f"an array of {length}" if length is not None else "an array"
        raise DecodeError("wrong_type", f"{what}: expected {expected}")
    return value


_VALID_CACHE_SIZE = 4096
valid_filters: dict[str, None] = {}
"""filters that passed `checked_filter` lately: every `tm` and `ta` carries one, and they repeat (a pure memo)"""
valid_topics: dict[str, None] = {}
"""topics that passed `checked_topic` lately"""
valid_shared: dict[str, None] = {}
"""shared filters (`$share/<group>/<filter>`) and repair filters (`$repair/<host>/<port>/<filter>`) that passed
`checked_shared_filter` or `checked_repair_filter` lately"""


def _remember(cache: dict[str, None], text: str) -> None:
    if len(cache) >= _VALID_CACHE_SIZE:
        cache.clear()
    cache[text] = None


def checked_filter(value: Any, what: str) -> str:
    if type(value) is str and value in valid_filters:
        return value
    text = checked_text(value, what)
    problem = validate_filter(text)
    if problem is not None or federated_filter(text) != text:
        raise DecodeError("bad_filter", f"{what}: {problem or 'not a federated filter'}")
    _remember(valid_filters, text)
    return text


def checked_shared_filter(value: Any, what: str) -> str:
    """`$share/<group>/<filter>` whose filter is a federated one: what a mode 2 `tm` and its `ta` carry."""
    if type(value) is str and value in valid_shared:
        return value
    text = checked_text(value, what)
    if validate_filter(text) is not None or not text.startswith(SHARE_PREFIX) \
            or federated_filter(text) is None:
        raise DecodeError("bad_filter", f"{what}: not a shared subscription of a federated filter")
    _remember(valid_shared, text)
    return text


def checked_repair_filter(value: Any, what: str) -> str:
    """`$repair/<host>/<port>/<filter>` whose filter is a federated one: what a mode 3 `tm` and its `ta` carry."""
    if type(value) is str and value in valid_shared:
        return value
    text = checked_text(value, what)
    parts = split_repair(text)
    if parts is None or validate_filter(text) is not None or federated_filter(parts[2]) != parts[2] \
            or parts[1] > 65535 or len(parts[0]) > 255:
        raise DecodeError("bad_filter", f"{what}: not a repair filter ($repair/<host>/<port>/<federated filter>)")
    _remember(valid_shared, text)
    return text


def checked_filter_or_shared(value: Any, what: str) -> str:
    """The filter of an acknowledgement: a federated filter, a shared one (mode 2) or a repair one (mode 3)."""
    if type(value) is str and value.startswith("$"):
        if value.startswith(REPAIR_PREFIX):
            return checked_repair_filter(value, what)
        return checked_shared_filter(value, what)
    return checked_filter(value, what)


def checked_reach(value: Any, what: str, limit: int) -> tuple[Address, ...]:
    """`ta.reach`, `tk.reach`: at most `limit` addresses."""
    items = checked_list(value, what)
    if len(items) > limit:
        raise DecodeError("out_of_range", f"{what}: {len(items)} addresses, at most {limit}")
    return tuple(checked_address(item, f"{what}[{index}]") for index, item in enumerate(items))


def checked_topic(value: Any, what: str) -> str:
    if type(value) is str and value in valid_topics:
        return value
    text = checked_text(value, what)
    problem = validate_topic(text)
    if problem is not None:
        raise DecodeError("bad_topic", f"{what}: {problem}")
    _remember(valid_topics, text)
    return text


def checked_address(value: Any, what: str) -> Address:
    host, port = checked_list(value, what, 2)
    return Address(checked_text(host, f"{what}.host", 255), checked_int(port, f"{what}.port", 0, 65535))


def checked_broker_id(value: Any, what: str) -> BrokerId:
    vid, host, port = checked_list(value, what, 3)
    return BrokerId(checked_int(vid, f"{what}.vid"),
                    Address(checked_text(host, f"{what}.host", 255), checked_int(port, f"{what}.port", 0, 65535)))


def port_ok(value: Any) -> bool:
    return type(value) is int and 0 <= value <= 65535


def host_ok(value: Any) -> bool:
    return type(value) is str and len(value) <= 255


def u64_ok(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_U64


def epoch_ok(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_EPOCH
