"""The fault suite on real processes (issue 19): does the federation keep MQTT's delivery contract?

Numbered QoS 1 and QoS 2 streams run from a publisher on the first broker to
a persistent subscriber on the last, through a line a-b-c and a ring
a-b-c-d of federated brokers and, as the reference, a Mosquitto bridge chain
a->b->c, while one fault happens and heals; then what the subscribers
printed is judged: lost, duplicated, out of order (docs/guarantees.md).

- `catalogue`: the faults, the topologies and their roles, the bridge analogues.
- `clients`: the paced publisher that records acknowledgements, the persistent subscriber.
- `counting`: the verdicts from what the subscriber printed (pure).
- `packet_filter`: partitions and link resets as nftables rules on lo, in a table of the run's own.
- `setups`: the federation and the bridge chain, and what each fault does to them.
- `runner`: one case: subscribe, probe, stream, fault, heal, drain, judge, explain.
- `suite`: the cases of a setup on one started setup; setups side by side in worker processes.
- `schedule`: random fault schedules reproducible from a seed (the long variant).
- `burst`: a QoS 2 burst through brokers left at Mosquitto's default `max_inflight_messages`.
- `report`: the side-by-side table and the notes on where the federation lost.
- `cli`: `python -m suites.faults`.
"""
