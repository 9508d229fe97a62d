"""SNMP, protocol-neutral: the v2c/v3 client and its walks, the profile format and its decoding (PDUs and CDUs)."""
