"""The datagram envelope between protocol packets and UDP: framing, authentication, replay, reassembly."""
