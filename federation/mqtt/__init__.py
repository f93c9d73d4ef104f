"""A sans-I/O MQTT client session (MQTT 5 and 3.1.1): bytes in, events out, time passed in.

Modules, one job each: `codec` (every packet to bytes and back), `properties`
(MQTT 5 properties), `runs` (plain publications and PUBACKs a run at a time:
the data path), `outgoing` (our QoS 1/2 publications in flight, packet ids,
the broker's Receive Maximum), `incoming` (our acknowledgements of the
broker's), `events` (what the session reports), `session` (the state
machine), `errors`. docs/mqtt-link.md says why it exists and what it
measures; nothing here imports a socket, a clock or paho.
"""
