"""The transparency suite (issue 20, item 6): can a client tell the federation from one broker?

The same client-level scenario (connect, subscribe with v5 options, publish
with properties, disconnect, come back, wait) runs with every client on one
Mosquitto broker, with the clients spread over a federation of three or four
brokers, and on a Mosquitto bridge chain (`topic # both`, what users compare
with); what every subscriber received is recorded by the clients themselves
and compared with one broker's (docs/transparency.md).

- `scenario`: the scenario model: sites, actions, payloads, properties, shared-subscription groups.
- `catalogue`: the cases (retained, shared groups, wills, expiry, no_local, overlapping filters, sessions,
  QoS, payload sizes, long topics and filters, subscription identifiers, topic aliases).
- `recorder`: the paho MQTT v5 client that records everything it gets, and the probe/fence client.
- `runner`: one scenario on one started setup: actions, probes, settles; a `Recording`.
- `setups`: one broker, the federation (line or ring), the bridge chain; what the wrappers said.
- `compare`: the verdict per case, with a readable diff (pure).
- `suite`: every case on every setup, each setup started once; `report`: the matrix; `cli`: the command.
"""
