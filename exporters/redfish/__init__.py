"""Redfish: tray BMCs' leak detectors and Redfish CDUs, discovered from the service root, polled and pushed."""
