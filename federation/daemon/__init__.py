"""The wrapper daemon: the I/O around `federation.protocol.node.Node` beside one Mosquitto broker.

Modules, one job each: `config` (YAML + flags -> a validated `DaemonConfig`),
`runtime` (one wrapper process from start to exit: startup order, signals,
shutdown), `startup` (the resources the configuration names, and the node's
boot), `running` (the started wrapper: the asyncio loop's handlers between
socket, broker and node), `clock` (the node's clock), `broker` (the paho
MQTT v5 connection), `mqtt_properties` (v5 properties to and from
`tm.properties`), `lean_client` (paho's client with a short data path),
`broker_items` (what the broker connection hands the loop), `udp` (the
overlay socket), `flow_control` (queues and pauses under overload),
`broker_health` (the broker connection's state and warnings), `event_log`
(the JSON-lines trace), `snapshots` (status document and metrics from a
running wrapper), `state` (boot epoch and subscription table on disk),
`status` (the `wrapper.py status` protocol and tables), `metrics`
(Prometheus), `cli` (the command line). docs/daemon.md is the user's guide.
"""
