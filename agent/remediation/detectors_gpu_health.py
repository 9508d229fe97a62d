"""Detectors of a GPU running below what it should: a PCIe link trained down, a hardware clock slowdown, a straggler.

Why apart from detectors_gpu: those judge faults (XIDs, a GPU lost, NVLink
errors) that stop a job; these judge a GPU that still works, only slower.
In a synchronous job every other GPU waits for the slowest one, so one GPU at
half its clock costs the whole job half its speed, and nothing fails loudly.
Each cause has its own detector (a warning that names it), and the straggler
detector, which sees only the effect (an SM clock or power out of line with
the node's other busy GPUs), names the cause when one of these explains it.
None of them drains or caps anything: the playbooks only notify.
"""

from __future__ import annotations

import statistics
from typing import Callable, Iterator

from exporters.model import Reading

from agent.snapshot import Snapshot

from .detectors_base import Context, DetectorBase
from .hysteresis import Observation, Tracker, targets_of
from .settings import DetectorSettings

GpuKey = tuple[str, str]  # (node, gpu)


def _key(r: Reading, ctx: Context) -> GpuKey:
    return r.labels.get("node", ctx.node), r.label("gpu")


def _busy(snap: Snapshot, ctx: Context) -> dict[GpuKey, float]:
    """(node, gpu) -> the GPU engine's utilisation (0-1), for the GPUs whose reading is ok."""
    return {_key(r, ctx): r.value for r in snap.select("supernode_gpu_utilization_ratio", engine="gpu") if r.ok}


def _clock_events(snap: Snapshot, ctx: Context) -> dict[GpuKey, set[str]]:
    """(node, gpu) -> the clock-event reasons active now (NVML's bit mask, one series per reason)."""
    out: dict[GpuKey, set[str]] = {}
    for r in snap.select("supernode_gpu_clock_event_active"):
        if r.ok:
            reasons = out.setdefault(_key(r, ctx), set())
            if r.value >= 0.5:
                reasons.add(r.label("reason"))
    return out


def _link(snap: Snapshot, ctx: Context, metric: str) -> dict[GpuKey, dict[str, float]]:
    """(node, gpu) -> {"current": ..., "max": ...} of one PCIe link family, ok readings only."""
    out: dict[GpuKey, dict[str, float]] = {}
    for r in snap.select(metric):
        if r.ok:
            out.setdefault(_key(r, ctx), {})[r.label("kind")] = r.value
    return out


class GpuHealthDetectors(DetectorBase):
    """PCIe link, hardware clock slowdown and stragglers, methods of the detector table (`Detectors`)."""

    HEALTH_DETECTORS = ("gpu_pcie_degraded", "gpu_clock_slowdown", "gpu_straggler")

    def __init__(self, settings: DetectorSettings, ctx: Context, clock: Callable[[], float] | None = None):
        super().__init__(settings, ctx, clock)
        for name in self.HEALTH_DETECTORS:
            self.trackers[name] = Tracker(getattr(settings, name))

    # -- PCIe link ---------------------------------------------------------------------

    def _pcie_states(self, snap: Snapshot) -> dict[GpuKey, tuple[bool | None, dict]]:
        """(node, gpu) -> (condition, detail) of the PCIe link.

        Width always: a link trained to fewer lanes than the GPU and its slot allow stays so until the next
        link training (a reset or a reboot), and it cuts host-device bandwidth in proportion. Generation only
        while the GPU is busy (utilisation at least gpu_pcie_generation_min_utilization_ratio): NVML's current
        generation is the link's speed now, and H100, A100 and Blackwell GPUs drop an idle link to Gen1 to
        save power (nvidia-smi shows "Current: 1" at idle), which is not a fault. An idle GPU whose width is
        fine and whose generation reads low says nothing either way (None: the state is kept)."""
        widths = _link(snap, self.ctx, "supernode_gpu_pcie_link_width")
        gens = _link(snap, self.ctx, "supernode_gpu_pcie_link_generation")
        busy = _busy(snap, self.ctx)
        loaded = self.s.gpu_pcie_generation_min_utilization_ratio
        out: dict[GpuKey, tuple[bool | None, dict]] = {}
        for key in set(widths) | set(gens):
            w, g = widths.get(key, {}), gens.get(key, {})
            narrow = "current" in w and "max" in w and w["current"] < w["max"]
            under_load = busy.get(key, 0.0) >= loaded
            slow = "current" in g and "max" in g and g["current"] < g["max"]
            cond: bool | None = True if narrow or (slow and under_load) else None if slow else False
            if not w and not g:
                continue
            out[key] = (cond, {"width": w.get("current"), "max_width": w.get("max"),
                               "generation": g.get("current"), "max_generation": g.get("max"),
                               "under_load": under_load})
        return out

    def _gpu_pcie(self, snap: Snapshot) -> Iterator[Observation]:
        for (node, gpu), (cond, detail) in self._pcie_states(snap).items():
            yield Observation("gpu_pcie_degraded", targets_of(node=node, gpu=gpu), "warning", cond, detail=detail)

    # -- hardware clock slowdown -------------------------------------------------------

    def _slowdowns(self, snap: Snapshot) -> dict[GpuKey, list[str]]:
        """(node, gpu) -> the configured hardware slowdown reasons active now (empty: none).

        NVML's HW Slowdown bit is an umbrella: it is set with HW Thermal Slowdown (gpu_thermal's cause, capped by
        its own playbook) and with HW Power Brake (the board's power brake input, e.g. asserted by a power
        supply), or alone (a power draw excursion the board's fast trigger caught). A HW Slowdown that a thermal
        reason explains is gpu_thermal's and not counted here. SW Power Cap is left out: the agent's own caps
        (gpu_thermal, the rack's power budget) set it."""
        wanted = set(self.s.gpu_clock_slowdown_reasons)
        thermal = set(self.s.gpu_thermal_clock_events)
        out: dict[GpuKey, list[str]] = {}
        for key, active in _clock_events(snap, self.ctx).items():
            hw = active & wanted
            if "hw_slowdown" in hw and active & thermal and "hw_power_brake" not in active:
                hw.discard("hw_slowdown")
            out[key] = sorted(hw)
        return out

    def _gpu_clock_slowdown(self, snap: Snapshot) -> Iterator[Observation]:
        for (node, gpu), reasons in self._slowdowns(snap).items():
            yield Observation("gpu_clock_slowdown", targets_of(node=node, gpu=gpu), "warning", bool(reasons),
                              detail={"reasons": reasons})

    # -- stragglers --------------------------------------------------------------------

    def _gpu_straggler(self, snap: Snapshot) -> Iterator[Observation]:
        """A busy GPU whose SM clock sits below, or whose power sits off, the median of its node's busy GPUs.

        Only GPUs under load (utilisation at least gpu_straggler_min_utilization_ratio) are compared, and only
        when at least gpu_straggler_min_gpus of a node are: an idle GPU's clock says nothing about a job, and
        with fewer GPUs the median is no reference. The clock counts only below the band (a faster GPU slows
        nobody); power on both sides (a GPU drawing far more or far less than its peers on the same job runs a
        different operating point). It clears once back within gpu_straggler_clear_band_fraction of the bands.

        Two references: the node's median, and the rack's (`supernode_gpu_rack_median_sm_clock_hertz`, the
        median of the busy trays' medians that every agent computes from the trays' link vectors,
        agent.coordination.rack_load). The node's shows one GPU off its tray mates; the rack's shows a whole
        tray running slow, which its own median never does. Against the rack only the clock counts (below
        only): trays run different jobs at different power, but a slower clock is what the others wait for. The
        rack reference needs no minimum of busy GPUs on this node (one busy GPU is judged against it), and is
        absent where the rack shares no link vectors (no NVLink attribution) or fewer than 3 trays are busy. A
        GPU that fired against the rack's reference is held (unknown), not cleared, while that reference is
        gone (stale: coordination lost); it clears on the reference, or when its job ends.

        The detail names the cause when one of the GPU's own conditions explains it, from the same snapshot:
        pcie_degraded, clock_slowdown, thermal (a thermal clock event, or gpu_thermal's incident open) or
        power_cap (SW Power Cap active: the GPU is at its power limit); else "unexplained"."""
        s = self.s
        busy = {k: u for k, u in _busy(snap, self.ctx).items() if u >= s.gpu_straggler_min_utilization_ratio}
        clocks = {_key(r, self.ctx): r.value for r in snap.select("supernode_gpu_clock_hertz", clock="sm") if r.ok}
        power = {_key(r, self.ctx): r.value for r in snap.select("supernode_gpu_power_watts") if r.ok}
        mr = snap.value("supernode_gpu_rack_median_sm_clock_hertz")  # None: no rack reference (or stale)
        nodes: dict[str, list[GpuKey]] = {}
        for key in set(clocks) | set(power):
            nodes.setdefault(key[0], []).append(key)
        causes: dict[GpuKey, list[str]] | None = None
        for node, keys in nodes.items():
            loaded = [k for k in keys if k in busy]
            clock_ref = [clocks[k] for k in loaded if k in clocks]
            power_ref = [power[k] for k in loaded if k in power]
            mc = statistics.median(clock_ref) if len(clock_ref) >= s.gpu_straggler_min_gpus else None
            mp = statistics.median(power_ref) if len(power_ref) >= s.gpu_straggler_min_gpus else None
            for key in sorted(keys):
                targets = targets_of(node=node, gpu=key[1])
                if key not in busy or (mc is None and mp is None and mr is None):
                    if key not in busy:
                        self._rack_stragglers.discard(key)
                    cond0: bool | None = None if key in self._rack_stragglers else False
                    yield Observation("gpu_straggler", targets, "warning", cond0)
                    continue
                clock, band, inside = clocks.get(key), s.gpu_straggler_clock_band_ratio, s.gpu_straggler_clear_band_fraction
                clock_off = _off(clock, mc, band, below_only=True)
                rack_off = _off(clock, mr, band, below_only=True)
                power_off = _off(power.get(key), mp, s.gpu_straggler_power_band_ratio, below_only=False)
                clock_back = not (_off(clock, mc, band * inside, below_only=True)
                                  or _off(clock, mr, band * inside, below_only=True))
                power_back = not _off(power.get(key), mp, s.gpu_straggler_power_band_ratio * inside, below_only=False)
                cond = True if clock_off or rack_off or power_off else False if clock_back and power_back else None
                if rack_off:
                    self._rack_stragglers.add(key)
                elif cond is not None and key in self._rack_stragglers:
                    if mr is None and not cond:
                        cond = None  # fired against the rack, whose reference is gone: unknown, held
                    else:
                        self._rack_stragglers.discard(key)
                detail: dict = {}
                if cond:
                    if causes is None:
                        causes = self._straggler_causes(snap)
                    why = causes.get(key, [])
                    detail = {"cause": ",".join(why) if why else "unexplained",
                              "off": [n for n, off in (("sm_clock", clock_off), ("sm_clock_vs_rack", rack_off),
                                                       ("power", power_off)) if off],
                              "sm_clock_hertz": clock, "node_median_sm_clock_hertz": mc,
                              "rack_median_sm_clock_hertz": mr,
                              "power_watts": power.get(key), "node_median_power_watts": mp,
                              "utilization_ratio": busy[key], "gpus_compared": len(loaded)}
                yield Observation("gpu_straggler", targets, "warning", cond, detail=detail)

    def _straggler_causes(self, snap: Snapshot) -> dict[GpuKey, list[str]]:
        """(node, gpu) -> the causes this node's detectors see now, in the order a person would check them."""
        out: dict[GpuKey, list[str]] = {}
        for key, (cond, _) in self._pcie_states(snap).items():
            if cond:
                out.setdefault(key, []).append("pcie_degraded")
        for key, reasons in self._slowdowns(snap).items():
            if reasons:
                out.setdefault(key, []).append("clock_slowdown")
        thermal = set(self.s.gpu_thermal_clock_events)
        hot = self.trackers["gpu_thermal"]
        for key, active in _clock_events(snap, self.ctx).items():
            st = hot.keys.get(targets_of(node=key[0], gpu=key[1]))
            if active & thermal or (st is not None and st.active):
                out.setdefault(key, []).append("thermal")
            if "sw_power_cap" in active:
                out.setdefault(key, []).append("power_cap")
        return out


def _off(value: float | None, median: float | None, band: float, below_only: bool) -> bool:
    """The value lies outside `band` (a share of the median) around the median; unknown values never do."""
    if value is None or median is None or median <= 0:
        return False
    if below_only:
        return value < median * (1 - band)
    return abs(value - median) > median * band
