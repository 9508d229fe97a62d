"""Simulated Redfish services: a GB200-shaped BMC per compute tray and a Redfish CDU, driven by the rack model."""
