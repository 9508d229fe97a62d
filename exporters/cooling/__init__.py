"""Liquid cooling over Modbus TCP: CDU and leak-sensor collectors, coolant physics, codec, client, valve control, probe."""
