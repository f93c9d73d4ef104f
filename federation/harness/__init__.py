"""Running scenarios and federations on real processes, whatever hosts them.

- `platform`: the interface a backend implements (network namespaces in
  `federation.netns`, LXD containers later) and the plan of each node.
- `driver`: the backend-neutral scenario driver (timeline, ground truth,
  convergence from status polls, report); `run_on_platform`.
- `checks`: what is checked before anything is created; each node's plan.
- `signals`: SIGTERM/SIGHUP unwind like Ctrl-C while a run is up.
- `clients`: real `mosquitto_sub` / `mosquitto_pub` clients and the deliveries
  read back from their output.
- `links`: cut / heal / loss state with the simulator's semantics.
- `traffic`: packet totals from event logs and status snapshots.
- `statusview`: readiness, convergence and views from status documents.
- `nodeconfig`: broker config, wrapper YAML and command line of a node.
- `processes`: spawning children that die with us, `poll` with a deadline.

This package imports nothing on its own, so `federation.tools.launch` can use
`processes` and `nodeconfig` without loading the driver.
"""
