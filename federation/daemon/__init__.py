"""The wrapper daemon: the I/O around `federation.node.Node` beside one Mosquitto broker.

Modules, one job each: `config` (YAML + flags -> a validated `DaemonConfig`),
`broker` (the paho MQTT v5 connection), `udp` (the overlay socket),
`runtime` (the asyncio loop that owns the node), `state` (boot epoch and
subscription table on disk), `status` (the `wrapper.py status` protocol and
tables), `metrics` (Prometheus), `cli` (the command line). docs/daemon.md is
the user's guide.
"""
