"""The two errors every collector shares: a profile that cannot be used, a device that does not answer a probe.

One class each, whatever the protocol: the agent, `check-config` and `probe` catch one name, and a profile
error is the same thing whether the YAML describes a CDU's registers, a PDU's OIDs, NVML fields or link counters.
"""

from __future__ import annotations


class ProfileError(ValueError):
    """A device profile that cannot be used (missing, not safe YAML, or invalid); the message names the file and
    the field."""


class ProbeError(Exception):
    """A one-off probe failed: the device did not answer, refused us, or the profile does not fit it; the message
    says which."""
