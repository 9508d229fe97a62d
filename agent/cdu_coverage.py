"""Which coolant detectors each CDU's profile can feed, said at check-config and start (never learnt in an incident).

Why: a coolant detector reads what the CDU publishes, and a reading that is
never published is not "unknown", it is absent: the detector has nothing to
observe for that CDU, so its incident can neither open nor clear, and nothing
else would say so. Vendors publish different subsets (the Liebert HPC's
BACnet object list has no loop temperature or flow; a pumped-refrigerant
Liebert XDP over Modbus has no secondary loop of water; a rear-door cooler
reports only its facility water). An operator relying on the agent for a
loop must know before the day it fails. The check reads the profiles only
(no I/O): a device that does publish the point but cannot be read is the
source's failure, reported as such at run time.
"""

from __future__ import annotations

from typing import Any, Iterable

# Detector -> (family, labels) it needs from the CDU, and the words an operator reads. Secondary: the rack loop,
# the one the coolant detectors judge (agent/remediation/detectors_cooling.py).
NEEDS: tuple[tuple[str, str, dict[str, str], str], ...] = (
    ("coolant_flow_low", "supernode_cdu_flow_cubic_meters_per_second", {"loop": "secondary"},
     "secondary (rack) loop flow"),
    ("coolant_supply_hot", "supernode_cdu_temperature_celsius", {"loop": "secondary", "point": "supply"},
     "secondary (rack) loop supply temperature"),
)


def missing(feeds: Iterable[tuple[str, dict[str, str]]]) -> list[tuple[str, str]]:
    """(detector, what it lacks) for each coolant detector the published readings `feeds` cannot feed."""
    have = list(feeds)
    return [(detector, what) for detector, family, labels, what in NEEDS
            if not any(f == family and all(ls.get(k) == v for k, v in labels.items()) for f, ls in have)]


def _profile(cdu: Any) -> Any:
    if getattr(cdu, "protocol", "modbus") == "bacnet":
        from exporters.cooling.bacnet.profile import load_profile
    else:
        from exporters.cooling.modbus_profile import load_profile
    return load_profile(cdu.profile)


def coverage_warnings(inventory: Any) -> list[str]:
    """One warning per inventory CDU whose profile cannot feed a coolant detector, naming both."""
    out: list[str] = []
    for cdu in inventory.cdus:
        try:
            profile = _profile(cdu)
        except Exception:  # a profile that does not load is refused by check-config with its field named
            continue
        gaps = missing(profile.feeds())
        if gaps:
            lacks = " and no ".join(what for _, what in gaps)
            detectors = ", ".join(d for d, _ in gaps)
            out.append(f"inventory.cdus.{cdu.name}: profile {cdu.profile!r} publishes no {lacks}: {detectors} "
                       f"cannot run for this CDU (no incident opens or clears on it); its other points are read")
    return out
