"""The project's benchmarks and verification suites, kept out of the installed package (as h11 keeps `bench/` and
`fuzz/`): `python -m suites.bench.NAME` prints figures beside the bridge chain, `python -m suites.faults` counts
what the federation loses under faults, `python -m suites.transparency` runs one scenario on one broker, the
federation and the bridge chain. Run from the checkout's root (or the unpacked sdist)."""
