"""LXD system containers as federation nodes: one container per broker, built from a scenario file.

Theory of operation: the same scenario/topology file that drives the
simulator (`federation.scenario`) describes which containers to create and
how they are linked. Everything that can be decided without a machine is
decided first and is pure (`plan`: names, configs, resource needs, firewall
rules), so a bad file or a topology too large for the machine fails before
anything exists. The adapters then touch the world in one direction each:
`host` brings up the LXD daemon on a Debian machine, `image` builds the
container image with Mosquitto and the Python dependencies baked in (the
containers have no internet), and `cluster` drives the containers with
pylxd. `lxc/provision.py` (`federation.lxd.cli`) is the command line and
`federation.lxd.backend` runs scenarios on the containers.

docs/lxc.md is the user's guide.
"""

from __future__ import annotations
