"""IMEX: the GB200 multi-node memory daemon and its NVLink domain."""
