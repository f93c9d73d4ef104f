"""Federation of independent Mosquitto brokers over a UDP overlay.

The protocol engine (`federation.protocol.node` and the modules it uses) is sans-I/O:
bytes, client events and the current time go in; datagrams, broker
injections and structured events come out. Adapters and the daemon are the
only parts that touch sockets, clocks and brokers.
"""

__version__ = "0.1.0"
