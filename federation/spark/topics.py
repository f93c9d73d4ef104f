"""MQTT topic filters as Java regular expressions, so Spark matches topics without a Python UDF.

Theory of operation
-------------------
The expected-delivery rule joins publications with the subscriptions whose
filter matches the topic. Calling `federation.protocol.topic_filter.matches` per row
would ship every row through a Python worker; a regular expression per
filter lets Spark's JVM do it (`topic RLIKE regex`). The translation follows
`federation.protocol.topic_filter.matches` (MQTT 5, section 4.7): `+` is one level
(possibly empty), a trailing `#` is the parent level and any number of
levels below it (`a/#` matches `a`), and a filter that starts with a
wildcard never matches a `$` topic. Literal characters are escaped for
java.util.regex (a backslash before an ASCII non-alphanumeric character is
always a literal there). tests/spark/test_spark_units.py checks the translation
against `matches` on generated filters and topics.
"""

from __future__ import annotations


def _literal(level: str) -> str:
    return "".join("\\" + ch if ch.isascii() and not ch.isalnum() else ch for ch in level)


def filter_regex(filter_: str) -> str:
    """A java.util.regex pattern (for RLIKE, anchored) matching exactly the topics `filter_` matches."""
    levels = filter_.split("/")
    parts: list[str] = []
    multi = False
    for position, level in enumerate(levels):
        if level == "#" and position == len(levels) - 1:
            multi = True
            break
        parts.append("[^/]*" if level == "+" else _literal(level))
    body = "/".join(parts)
    if multi:
        body = f"{body}(/.*)?" if parts else ".*"
    guard = "(?!\\$)" if filter_[:1] in ("+", "#") else ""
    return f"^{guard}{body}$"
