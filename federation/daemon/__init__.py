"""The wrapper daemon: the I/O around `federation.protocol.node.Node` beside one Mosquitto broker.

Modules, one job each: `config` (YAML + flags -> a validated `DaemonConfig`),
`broker` (the paho MQTT v5 connection),
`lean_client` (paho's client with a short data path), `broker_items` (what
the broker connection hands the loop), `udp` (the overlay socket),
`runtime` (the asyncio loop that owns the node), `flow_control` (queues and
pauses under overload), `broker_health` (the broker connection's state and
warnings), `event_log` (the JSON-lines trace), `snapshots` (status document
and metrics from a running wrapper), `state` (boot epoch and subscription
table on disk), `status` (the `wrapper.py status` protocol and tables),
`metrics` (Prometheus), `cli` (the command line). docs/daemon.md is
the user's guide.
"""
