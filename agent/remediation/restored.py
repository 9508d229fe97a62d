"""After a restart or a reload: restored incidents take part in detection again.

Why: a fresh detector tracker knows nothing, so it never emits "clear"
for an incident restored from the journal; a cap or a drain would then stay
forever although the condition cleared while the agent was stopped. Marking
each restored local incident active in the new trackers makes the first
fresh snapshots decide, with the usual clear hold: still true, nothing
happens (no second playbook); no longer true, it clears and its actions are
undone like any other. The ladder's reset, reboot and service incidents also
restore their fault in the GPU fault judge (its XID history is lost with the
old process), so they still clear only on a proven recovery. Incidents from Alertmanager are resolved by its
resolved notifications (or by a person: `incidents resolve|reject`).
"""

from __future__ import annotations

from typing import Iterable

from .detectors import Detectors
from .hysteresis import _KeyState, targets_of
from .incidents import Incident

# The recovery ladder's detectors whose fault only a proven recovery ends (app is an event: nothing to restore).
LADDER_DETECTORS = {"gpu_reset_required": "reset", "gpu_reboot_required": "reboot",
                    "gpu_service_required": "service"}


def seed_restored(detectors: Detectors, incidents: Iterable[Incident]) -> int:
    """Mark restored local incidents active in `detectors`; returns how many were seeded."""
    n = 0
    for inc in incidents:
        tracker = detectors.trackers.get(inc.detector)
        if inc.source != "local" or tracker is None:
            continue
        st = tracker.keys.setdefault(targets_of(**inc.targets), _KeyState())
        st.active, st.count = True, tracker.consecutive
        klass = LADDER_DETECTORS.get(inc.detector)
        if klass is not None:  # the judge's memory died with the old process: the fault holds until proven
            detectors.gpu_faults.restore(klass, inc.targets.get("node", ""), inc.targets.get("gpu"), inc.opened_at)
        n += 1
    return n
