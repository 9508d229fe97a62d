"""Detectors of the GPUs and their NVLinks: thermal, the recovery ladder's four (from the GPU fault judge), lost or
hung GPUs, link errors.

Why apart: these read only what the NVML source publishes (about a thousand
readings a publish on a GB200 node, hence the cached link rates) and target a
node or one of its GPUs; nothing here reads the loop or the facility.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from exporters.model import Quality, Reading

from agent.snapshot import Snapshot

from .detectors_base import Context, DetectorBase
from .gpu_faults import GpuReadings
from .hysteresis import Observation, targets_of


def _node(r: Reading, ctx: Context) -> str:
    return r.labels.get("node", ctx.node)


class GpuDetectors(DetectorBase):
    """GPUs and NVLink, methods of the detector table (`Detectors`)."""

    def _gpu_thermal(self, snap: Snapshot) -> Iterator[Observation]:
        s = self.s
        hw: dict[tuple[str, str], bool] = {}
        reasons = set(s.gpu_thermal_clock_events)
        for r in snap.select("supernode_gpu_clock_event_active"):
            if r.ok and r.label("reason") in reasons:
                key = (_node(r, self.ctx), r.label("gpu"))
                hw[key] = hw.get(key, False) or r.value >= 0.5
        for item in self._ok_or_fault(snap.select("supernode_gpu_temperature_celsius", sensor="gpu")):
            if isinstance(item, Observation):
                yield item
                continue
            node, gpu = _node(item, self.ctx), item.label("gpu")
            slowdown = snap.value("supernode_gpu_temperature_threshold_celsius", gpu=gpu, threshold="slowdown")
            near = slowdown is not None and item.value >= slowdown - s.gpu_thermal_margin_celsius
            far = slowdown is None or item.value < slowdown - s.gpu_thermal_clear_margin_celsius
            throttled = hw.get((node, gpu), False)
            cond = True if (near or throttled) else False if far else None
            yield Observation("gpu_thermal", targets_of(node=node, gpu=gpu), "warning", cond,
                              detail={"temperature_celsius": item.value, "slowdown_celsius": slowdown,
                                      "thermal_clock_event": throttled})

    def _gpu_faults(self, snap: Snapshot) -> Iterator[Observation]:
        """The four ladder detectors from the GPU fault judge (gpu_faults.py): each true for the GPU's current class.

        The app class is an event (true on the snapshot that brought its XID; its hold clears it); the others
        hold while the judge keeps the fault outstanding, which only a proven recovery ends."""
        judge, ctx = self.gpu_faults, self.ctx
        r, drill = GpuReadings(), GpuReadings()
        for x in snap.select("supernode_gpu_xid_errors_total"):
            if x.ok and x.label("xid").isdigit() and x.label("drill") == "true":
                drill.xids.append((_node(x, ctx), x.label("gpu"), int(x.label("xid")), 1))
            elif x.ok and x.label("xid").isdigit():
                d = self.rates.delta(x)
                r.xids.append((_node(x, ctx), x.label("gpu"), int(x.label("xid")), int(x.value if d is None else d)))
        for x in snap.select("supernode_gpu_recovery_action"):
            if x.ok and x.value >= 0.5 and x.label("action") not in ("none", ""):
                r.verdicts[(_node(x, ctx), x.label("gpu"))] = (x.label("action"), x.timestamp)
        for family, into in (("supernode_gpu_remapped_rows_pending", r.remap_pending),
                             ("supernode_gpu_remapped_rows_failure", r.remap_failure)):
            for x in snap.select(family):
                if x.ok and x.value >= 0.5:
                    into[(_node(x, ctx), x.label("gpu"))] = x.timestamp
        hung = _gpus_hung(snap, ctx)  # a hang is not a visit: only a GPU off the bus and back ends a service fault
        for x in snap.select("supernode_gpu_up"):
            if x.ok and (key := (_node(x, ctx), x.label("gpu"))) not in hung:
                r.up[key] = (x.value >= 0.5, x.label("uuid"))
        for x in snap.select("supernode_gpu_info"):
            if x.label("serial"):
                r.serials[(_node(x, ctx), x.label("gpu"))] = x.label("serial")
        app_events = judge.update(r)
        drill_faults, drill_apps = self._drill_xids(drill)
        reboot: dict[str, list[dict]] = {}
        for (node, gpu), g in judge.gpus.items():
            f, mark = g.fault, {}
            if f is None and (node, gpu) in drill_faults:  # a real fault of the GPU outranks its drill's
                f, mark = drill_faults[(node, gpu)], {"drill": True}
            klass = f.klass if f is not None else None
            detail = {"gpu": gpu, **f.detail(), **mark} if f is not None else {}
            app = (node, gpu) in app_events or bool(mark and (node, gpu) in drill_apps)
            yield Observation("gpu_app_fault", targets_of(node=node, gpu=gpu), "warning", app, detail=detail)
            yield Observation("gpu_reset_required", targets_of(node=node, gpu=gpu), "critical", klass == "reset",
                              detail=detail)
            yield Observation("gpu_service_required", targets_of(node=node, gpu=gpu), "critical", klass == "service",
                              detail={**detail, "vendor": judge.vendor_report((node, gpu))} if klass == "service"
                              else detail)
            reboot.setdefault(node, [])
            if klass == "reboot":
                reboot[node].append(detail)
        for node, gpus in reboot.items():
            drill_only = bool(gpus) and all(d.get("drill") for d in gpus)
            yield Observation("gpu_reboot_required", targets_of(node=node), "critical", bool(gpus),
                              detail={"gpus": gpus, **({"drill": True} if drill_only else {})} if gpus else {})

    def _drill_xids(self, drill: GpuReadings) -> tuple[dict[tuple[str, str], Any], set[tuple[str, str]]]:
        """(GPU -> the drill's outstanding fault, GPUs with a new app event) from a fault drill's XID readings,
        each one new event the first time the drill's judge sees it; no drill XID now: no drill judge."""
        if not drill.xids:
            self.drill_gpu_faults = None
            return {}, set()
        judge = self.drill_gpu_faults
        if judge is None:
            judge = self.drill_gpu_faults = self.new_drill_judge()
        drill.xids = [(n, g, x, 0 if (n, g) in judge.gpus else 1) for n, g, x, _ in drill.xids]
        apps = judge.update(drill)
        return {k: g.fault for k, g in judge.gpus.items() if g.fault is not None}, apps

    def _gpu_lost(self, snap: Snapshot) -> Iterator[Observation]:
        up: dict[str, int] = {}
        hung = _gpus_hung(snap, self.ctx)
        gpus = list(snap.select("supernode_gpu_up"))
        # GPUs NVML enumerates per node (a uuid read); the exporter fills the inventory's missing indices with
        # supernode_gpu_up 0 and an empty uuid (fewer GPUs than the inventory: one fell off the bus at boot).
        seen: dict[str, int] = {}
        for r in gpus:
            if r.ok and r.label("uuid"):
                seen[_node(r, self.ctx)] = seen.get(_node(r, self.ctx), 0) + 1
        for r in gpus:
            if not r.ok:
                yield self._fault(r)
                continue
            node = _node(r, self.ctx)
            up[node] = up.get(node, 0) + (1 if r.value >= 0.5 else 0)
            # A GPU whose NVML calls hang does not answer either: lost to its jobs, said why in the detail. One with no
            # identity is one NVML never named: the GPU count below the inventory (or lost before its uuid was read),
            # said with the count of GPUs NVML did name.
            # A hung GPU is held longer than a lost one (a slow read answers again at the next poll); its detail
            # is the evidence: since when it has read hung, and for how long by this poll.
            detail: dict[str, object] = {}
            min_fire = 0.0
            if r.value < 0.5:
                if (key := (node, r.label("gpu"))) in hung:
                    since = self._hung_since.setdefault(key, hung[key])
                    detail = {"why": "hung", "hung_since": since, "hung_seconds": round(hung[key] - since, 3)}
                    min_fire = self.s.gpu_lost_hung_fire_seconds
                elif not r.label("uuid") and self.ctx.expected_gpus:
                    detail = {"why": "missing", "seen": seen.get(node, 0), "expected": self.ctx.expected_gpus}
                else:
                    detail = {"why": "lost"}
            yield Observation("gpu_lost", targets_of(node=node, gpu=r.label("gpu")), "critical", r.value < 0.5,
                              detail=detail, min_fire_seconds=min_fire)
        for key in [k for k in self._hung_since if k not in hung]:
            del self._hung_since[key]  # answered again (or off the bus): a later hang is a new one
        expected = self.ctx.expected_gpus
        if expected:
            for node, n in up.items():
                yield Observation("gpu_lost", targets_of(node=node, gpu="missing"), "critical",
                                  n < expected and len([r for r in gpus if _node(r, self.ctx) == node]) < expected,
                                  detail={"seen": n, "expected": expected})

    def _nvlink(self, snap: Snapshot) -> Iterator[Observation]:
        """Per GPU: its worst link's error rate (summed over the counted types), effective BER, links down."""
        errors = snap.by_name.get("supernode_nvlink_errors_total", [])
        seen, per_link = self._nvlink_rates
        # The NVML source reads error counters every few polls and gives the same readings again between
        # reads: the same readings give the same rates (each is keyed on its own timestamp), so ~1,000 of them
        # are not walked again. The list compare is by identity first, in C.
        if errors != seen:
            per_link = self._link_error_rates(errors)
            self._nvlink_rates = (errors, per_link)
        # Links the rack attributes to their NVSwitch chip are the switch's fault, not this tray's (unless the
        # operator drains the whole partition for it): left out, so a switch fault never drains a tray.
        switch = set() if self.s.nvlink_switch_fault_drain_partition else _switch_side(snap)
        down: dict[tuple[str, str], list[str]] = {}
        ber: dict[tuple[str, str], list[str]] = {}
        excluded: dict[tuple[str, str], set[str]] = {}
        for r in snap.select("supernode_nvlink_bit_error_rate", kind="effective"):
            if r.ok:
                key = (_node(r, self.ctx), r.label("gpu"))
                ber.setdefault(key, [])
                if r.value > self.s.nvlink_effective_ber:
                    (excluded.setdefault(key, set()).add if r.label("link") in switch else ber[key].append)(
                        r.label("link"))
        drill: dict[tuple[str, str], bool] = {}  # a GPU whose down links are all a fault drill's stand-ins
        for r in snap.select("supernode_nvlink_up"):
            if r.ok:
                key = (_node(r, self.ctx), r.label("gpu"))
                down.setdefault(key, [])
                if r.value < 0.5 and r.label("link") in switch:
                    excluded.setdefault(key, set()).add(r.label("link"))
                elif r.value < 0.5:
                    down[key].append(r.label("link"))
                    drill[key] = drill.get(key, True) and r.label("drill") == "true"
        worst: dict[tuple[str, str], float] = {}
        for (node, gpu, link), rate in per_link.items():
            if link not in switch:
                worst[(node, gpu)] = max(worst.get((node, gpu), 0.0), rate)
        for key in set(worst) | set(down) | set(ber):
            rate = worst.get(key, 0.0)
            links_down, links_ber = down.get(key, []), ber.get(key, [])
            real = rate > self.s.nvlink_error_rate_per_second or bool(links_ber) or (links_down and not drill[key])
            cond = bool(real) or bool(links_down)
            yield Observation("nvlink_errors", targets_of(node=key[0], gpu=key[1]), "critical", cond,
                              detail={"errors_per_second": round(rate, 3), "links_down": links_down,
                                      "links_ber_high": links_ber,
                                      "links_switch_side": sorted(excluded.get(key, ()), key=int),
                                      **({"drill": True} if cond and not real else {})})

    def _nvlink_switch(self, snap: Snapshot) -> Iterator[Observation]:
        """A switch chip the rack attributes its link's failures to (agent.coordination.attribution): one rack
        incident per chip, opened by the rack leader only (every agent holds the same verdict; one tells)."""
        leads = self.ctx.leads()
        for r in snap.select("supernode_nvlink_switch_fault"):
            if not r.ok:
                continue
            chip, tray = r.label("switch_chip"), r.label("switch_tray")
            targets = targets_of(switch_chip=chip, switch_tray=tray) if tray else targets_of(switch_chip=chip)
            yield Observation("nvlink_switch_fault", targets, "warning", leads and r.value >= 0.5,
                              detail={"switch_chip": chip, "switch_tray": tray or None,
                                      "drain_partition": self.s.nvlink_switch_fault_drain_partition,
                                      **({"drill": True} if r.label("drill") == "true" else {})})

    def _gpu_fabric(self, snap: Snapshot) -> Iterator[Observation]:
        """Per GPU with an NVLink fabric: off it (registration not completed, or completed with a failed status), or
        its routes unhealthy (health mask route_unhealthy): such a GPU runs no multi-node NVLink work, though
        its links may read up. Critical: every multi-node job on the domain that lands on it fails.

        Not fired for degraded_bandwidth, route_recovery or access_timeout_recovery alone: the fabric still
        carries the GPU's traffic (at reduced bandwidth, or recovering by itself), and a switch-side fault
        sets them on every GPU of the domain at once, where draining every tray would be the wrong answer
        (the rack's attribution, nvlink_switch_fault, speaks for those; they are exported and in the detail).
        A GPU that reads state not_supported has no fabric: no observation."""
        current: dict[tuple[str, str], str] = {}
        for r in snap.select("supernode_gpu_fabric_state"):
            if r.ok and r.value >= 0.5:
                current[(_node(r, self.ctx), r.label("gpu"))] = r.label("state")
        status: dict[tuple[str, str], float] = {}
        for r in snap.select("supernode_gpu_fabric_status_code"):
            if r.ok:
                status[(_node(r, self.ctx), r.label("gpu"))] = r.value
        health: dict[tuple[str, str], list[str]] = {}
        for r in snap.select("supernode_gpu_fabric_health"):
            if r.ok and r.value >= 0.5:
                health.setdefault((_node(r, self.ctx), r.label("gpu")), []).append(r.label("condition"))
        for key, state in sorted(current.items()):
            if state == "not_supported":
                continue
            code = status.get(key, 0.0)
            conditions = sorted(health.get(key, []))
            off = state != "completed" or code != 0
            cond = off or "route_unhealthy" in conditions
            yield Observation("gpu_fabric_degraded", targets_of(node=key[0], gpu=key[1]), "critical", cond,
                              detail={"state": state, "status": int(code), "health": conditions})

    def _link_error_rates(self, errors: Iterable[Reading]) -> dict[tuple[str, str, str], float]:
        """(node, gpu, link) -> the summed rate of its counted error types."""
        types = set(self.s.nvlink_error_types)
        per_link: dict[tuple[str, str, str], float] = {}
        node, rate_of, ok = self.ctx.node, self.rates.rate, Quality.OK
        for r in errors:  # ~1,000 a publish on a GB200 node: labels read directly
            lab = r.labels
            if r.quality is not ok or lab.get("type") not in types:
                continue
            key = (lab.get("node", node), lab.get("gpu", ""), lab.get("link", ""))
            per_link[key] = per_link.get(key, 0.0) + (rate_of(r) or 0.0)
        return per_link


def _switch_side(snap: Snapshot) -> set[str]:
    """The NVLink indices the rack's attribution calls switch-side now (supernode_nvlink_switch_fault 1)."""
    return {r.label("switch_chip") for r in snap.select("supernode_nvlink_switch_fault") if r.ok and r.value >= 0.5}


def _gpus_hung(snap: Snapshot, ctx: Context) -> dict[tuple[str, str], float]:
    """(node, gpu) of the GPUs the NVML collector reports hung (supernode_gpu_hung 1), each with its reading's time."""
    return {(_node(r, ctx), r.label("gpu")): r.timestamp for r in snap.select("supernode_gpu_hung")
            if r.ok and r.value >= 0.5}
