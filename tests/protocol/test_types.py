"""Address and BrokerId text forms: what events, logs and the status document print must parse back."""

from __future__ import annotations

import pytest

from federation.protocol.types import Address, BrokerId


@pytest.mark.parametrize("address", [Address("127.0.0.1", 10500), Address("::1", 10500),
                                     Address("fe80::1%eth0", 7), Address("broker.example", 10500)])
def test_text_parses_back(address: Address) -> None:
    assert Address.parse(str(address), default_port=1) == address


def test_ipv6_is_bracketed() -> None:
    assert str(Address("::1", 10500)) == "[::1]:10500"
    assert str(BrokerId(3, Address("2001:db8::2", 10500))) == "3@[2001:db8::2]:10500"
    assert str(Address("10.0.0.1", 10500)) == "10.0.0.1:10500"


@pytest.mark.parametrize("text, problem", [("", "empty"), ("[::1]:0", "bad port"), ("host:99999", "bad port"),
                                           ("host:x", "bad port")])
def test_bad_text_says_why(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Address.parse(text, default_port=10500)
