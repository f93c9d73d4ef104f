"""Tools around the federation: the demo, the local launcher, benchmarks."""
