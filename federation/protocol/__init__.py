"""The protocol engine, sans-I/O: packets, time and randomness in; packets, injections and events out."""
