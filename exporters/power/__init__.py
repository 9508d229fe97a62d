"""Rack power over SNMP: the PDU collector, its metric families, the v2c/v3 clients, decoding and device profiles."""
