"""The series budget: which per-link and per-flag series /metrics exports by default (README, "Series budget").

Why: one GB200 tray served 3,374 series, three quarters of them zeros that say nothing (ten NVLink error
counters on each of 72 links, 320 transceiver flags that are off, a BER per link that is 0). A hall of such racks
is more than one Prometheus holds. The detail is exported where it carries information, the rest stays one
config switch away (`metrics.detail`), and nothing is lost: the per-GPU roll-ups (exporters/gpu/nvlink_rollup.py)
and `supernode_optic_alarms_read` always exist.

Only the exposition is budgeted. The snapshot keeps every reading, so the detectors, the status page and the link
vectors shared over coordination read every link as before (none of them reads /metrics).

Rules, per group (each a decision a test pins, tests/test_series_budget.py):
- `nvlink_link_errors`: a link's error counters (all its types) from the first scrape at which any of them is
  non-zero, and from then on while the agent runs, so a counter never disappears and reappears (a GPU reset that
  zeroes them reads as a counter reset, which rate() handles). A restart forgets: counters still non-zero since
  the driver loaded come back at the first scrape; a link whose counters were zeroed meanwhile has nothing to say.
  The GPU's own totals by type (`supernode_gpu_nvlink_errors_total`) always exist, so the first error of a link is
  in rate() of its GPU even where the link's own series only begins with it.
- `nvlink_link_ber`: a link's BER series (both kinds) from the first non-zero value, kept the same way; the GPU's
  worst link by kind always (`supernode_gpu_nvlink_bit_error_rate_max`).
- `nvlink_link_traffic`: per-link bytes only with the detail on; the GPU's totals always (what the dashboards sum).
- `nvlink_link_remote`: which link reaches which device (a static fact per link, "switch" on all 18 of a GB200
  GPU) only with the detail on; the GPU's links by remote type always (`supernode_gpu_nvlink_remote_links`).
- `optic_alarms`: a flag's series only while it is raised (a state set of the active ones; a gauge, so its
  disappearing when the flag clears is the ordinary end of an alert); `supernode_optic_alarms_read` says the flags
  were read, so "no alarm" (read, none raised) differs from "not read".
- `gpu_state_sets`: the driver's recovery action and the fabric registration (state sets: one member is 1) and
  the clock-event reasons (flags) of each GPU, only the members that read 1 (8 + 4 + 8 series a GPU, of which
  one or two say anything). The alert rules compare these with `== 1`, which absent zeros do not change;
  `supernode_gpu_up` says the GPU was read, so "no reason active" differs from "not read".
"""

from __future__ import annotations

from typing import Iterable

from exporters.gpu import nvml_metrics as M
from exporters.links.dom import OPTIC_ALARM
from exporters.model import Quality, Reading

# group -> the families it holds back by default (what `metrics.detail: [group]` exports in full)
DETAIL_GROUPS: dict[str, tuple[str, ...]] = {
    "nvlink_link_errors": (M.NVLINK_ERRORS.name,),
    "nvlink_link_ber": (M.NVLINK_BER.name,),
    "nvlink_link_traffic": (M.NVLINK_TX.name, M.NVLINK_RX.name),
    "nvlink_link_remote": (M.NVLINK_REMOTE.name,),
    "optic_alarms": (OPTIC_ALARM.name,),
    "gpu_state_sets": (M.RECOVERY.name, M.FABRIC_STATE.name, M.CLOCK_EVENT.name),
}
# Groups whose series are exported only while they read 1: a flag raised, the active member of a state set.
_ACTIVE_ONLY = frozenset({"optic_alarms", "gpu_state_sets"})
_STICKY = {M.NVLINK_ERRORS.name: "nvlink_link_errors", M.NVLINK_BER.name: "nvlink_link_ber"}
_BUDGETED = {family: group for group, families in DETAIL_GROUPS.items() for family in families}


def _link(r: Reading) -> tuple[str, str, str]:
    labels = r.labels
    return labels.get("gpu", ""), labels.get("uuid", ""), labels.get("link", "")


class SeriesBudget:
    """Filters the readings /metrics renders; holds which links have shown errors or a BER (the sticky part).

    One per agent, kept across config reloads (a reload that turns a group's detail off must not make a link
    that had errors vanish and come back later)."""

    def __init__(self) -> None:
        self._shown: dict[str, set[tuple[str, str, str]]] = {group: set() for group in _STICKY.values()}

    def apply(self, readings: Iterable[Reading], detail: Iterable[str] = ()) -> list[Reading]:
        """The readings to export: every reading outside a budgeted family, and the budgeted ones that inform."""
        readings = list(readings)
        full = set(detail)
        if full.issuperset(DETAIL_GROUPS):
            return readings
        for r in readings:  # learn first: a link erroring on one type shows all its types at the same scrape
            group = _STICKY.get(r.spec.name)
            if group is not None and r.quality is Quality.OK and r.value != 0:
                self._shown[group].add(_link(r))
        out = []
        for r in readings:
            group = _BUDGETED.get(r.spec.name)
            if group is None or group in full:
                out.append(r)
            elif group in self._shown:
                if _link(r) in self._shown[group]:
                    out.append(r)
            elif group in _ACTIVE_ONLY and r.value >= 0.5:
                out.append(r)
        return out
