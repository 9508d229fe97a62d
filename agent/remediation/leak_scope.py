"""Leak containment by scope: which tray a wet detector is in, which trays lie below it, what widens a leak.

Why apart: the scope of a leak is the rack's physical layout (rack units, trays, zones, the loop) applied to
what the detectors read; the detectors (detectors_cooling.py) and the target resolver (targets.py) both ask
it, so the rule lives once. The scopes, narrowest first, and the evidence that widens each one:

- tray (`leak_tray`): one compute tray's own BMC detectors wet; contained by that tray (drain, cap, power off).
  The trays directly below it (inventory.rack_units) are watched at the next scope, "below": drained and
  flagged, never capped or powered off (no detector of theirs is wet).
- zone (`leak`): a zone's own sensor wet (its leak rope, a switch tray's detector, a CDU channel), or the
  detectors of `zone_leak_trays` compute trays of the zone wet at once: the zone valve closes.
- rack (`tray_leak_rack`): more than `rack_tray_leaks` trays of the rack wet: the rack valve.
- loop (`leak_loop`): a detector wet while the loop's secondary flow is below `flow_low_ratio` of its
  baseline or its supply pressure below `leak_loop_pressure_floor_pascals`: coolant is leaving the loop.
"""

from __future__ import annotations

from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field

SCOPES = ("tray", "below", "zone", "rack", "loop")
# The detector of each scope's incident, and the scope of each leak playbook's incident.
SCOPE_OF_DETECTOR = {"leak_tray": "tray", "leak": "zone", "tray_leak_rack": "rack", "leak_loop": "loop"}


def bmc_of_sensor(sensor: str) -> str:
    """A Redfish detector's sensor label is `bmc/chassis/detector` (before the first walk: the bmc alone)."""
    return sensor.split("/", 1)[0]


def tray_of_sensor(sensor: str, tray_bmcs: Mapping[str, str]) -> str | None:
    """The compute tray (its node) whose own BMC reports this detector, else None (a zone's own sensor)."""
    return tray_bmcs.get(bmc_of_sensor(sensor))


def trays_below(rack_units: Mapping[str, int], tray: str, count: int) -> list[str]:
    """The `count` trays directly below `tray` in the rack, nearest first (compute and switch trays alike: a
    drip falls on whatever is below). Empty when the tray has no position (inventory.rack_units not set)."""
    unit = rack_units.get(tray)
    if unit is None or count <= 0:
        return []
    below = sorted(((u, t) for t, u in rack_units.items() if u < unit), reverse=True)
    return [t for _, t in below[:count]]


def zone_evidence(wet_sensors: list[str], tray_bmcs: Mapping[str, str], zone_leak_trays: int) -> str | None:
    """Why a zone's wet detectors are the zone's leak (in words, for the journal), or None: one tray's own."""
    own = sorted(s for s in wet_sensors if tray_of_sensor(s, tray_bmcs) is None)
    if own:
        return f"zone sensor wet: {', '.join(own)}"
    trays = sorted({t for s in wet_sensors if (t := tray_of_sensor(s, tray_bmcs)) is not None})
    if len(trays) >= zone_leak_trays:
        return f"{len(trays)} trays wet at once: {', '.join(trays)}"
    return None


class LeakScopeSettings(BaseModel):
    """Leak containment by scope (this module): what a tray leak watches, when a leak's
    actions may be undone (`remediation.leak_scope`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    watch_below_trays: int = Field(default=1, ge=0, le=20, description=(
        "Trays directly below a leaking compute tray (inventory.rack_units) that are watched: drained (step "
        "approval leak_watch_below, automatic by default) and flagged; 0: none. Default 1, the tray a drip reaches "
        "first, which fits the default blast radius (2 drained) with the leaking tray itself."))
    watch_poll_seconds: float = Field(default=0.5, gt=0, description=(
        "While a tray leaks, the BMCs of the trays watched below it are asked for a poll this often (the leak "
        "rope's interval), not at sources.redfish's; by the agent that reads them (the rack leader, with "
        "sources.redfish.watch_rack_trays)."))
    dry_hold_seconds: float = Field(default=900.0, ge=0, description=(
        "Nothing a leak did is undone (resume, power on, valve open, caps) until every detector of its scope has "
        "read dry for this long; then a person approves, shown each detector's dry history. A detector that "
        "cannot be read (a fault, its source down, no reading) is not dry."))
