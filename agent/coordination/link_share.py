"""One agent's side of the rack's NVLink attribution: its own link vector out, every tray's in, the verdict in
its store.

Why in the store: the verdict is readings (`supernode_nvlink_switch_fault{switch_chip,switch_tray}` and the
trays counted) under the source `nvlink_attribution/rack`, so the detectors read it like any poll (the rack
leader opens `nvlink_switch_fault`, every agent's `nvlink_errors` leaves switch-side links out), /metrics
exports it and its staleness rule applies: an agent that stops attributing (coordination lost) has no verdict
within a few seconds, and its nvlink_errors detector judges its links alone again, as without coordination.

Every agent computes the verdict itself from the same vectors (each mirrors the rack's `links/` keys), so a
follower's local detector does not wait for the leader; its own vector counts at once, before its put
returns. Vectors are put when they change and again every `refresh` seconds, so a vector older than
`max_age` (3 refreshes) means a tray whose NVML reads stopped (agent.coordination.attribution: stale).

The same vectors carry each tray's load and cooling summaries (agent.coordination.tray_cooling), so the
rack's references are readings of this source too: the median busy SM clock (stragglers) and the median
thermal resistance of the other trays' loaded GPUs (cold plates); and the derate by margin plans the rack's
shed from the trays' margins as they were just before the loop changed (`cooling_before`). On a rack that
is no NVLink domain the share still runs, for those summaries alone: no verdict is published there (the
source keeps its first name, `nvlink_attribution`).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Iterable

from agent.coordination.attribution import Attribution, attribute, switch_tray_of
from agent.coordination.link_vectors import LinkVector, VectorBuilder, decode, encode
from agent.coordination.rack_load import rack_load
from agent.coordination.tray_cooling import CoolingBuilder, TrayCooling, rack_resistance
from exporters.model import Quality, gauge, make_reading

SOURCE, DEVICE = "nvlink_attribution", "rack"
NVLINK_SWITCH_FAULT = gauge("supernode_nvlink_switch_fault", (
    "1 while the rack attributes NVSwitch chip switch_chip's failures to the switch (its NVLink index fails on at "
    "least remediation.detectors.nvlink_switch_fault_min_trays compute trays), 0 otherwise; switch_tray is the "
    "inventory's switch tray of that chip (empty when inventory.switch_trays does not list it)."),
    ("switch_chip", "switch_tray"))
NVLINK_ATTRIBUTION_TRAYS = gauge("supernode_nvlink_attribution_trays", (
    "Compute trays in this agent's NVLink attribution, by state: counted (a fresh link vector), stale (older "
    "than 3 refreshes: its NVML reads stopped) or silent (no vector: its agent is not publishing)."), ("state",))
NVLINK_TRAY_SIDE_LINKS = gauge("supernode_nvlink_tray_side_links", (
    "NVLinks failing (down or erroring) in the rack that the attribution leaves to their own tray (tray-side)."))
GPU_RACK_MEDIAN_SM_CLOCK = gauge("supernode_gpu_rack_median_sm_clock_hertz", (
    "The rack's reference SM clock for busy GPUs in hertz: the median of the compute trays' median busy-GPU SM "
    "clocks (agent.coordination.rack_load); absent with fewer than 3 trays under load. The straggler detector "
    "judges a busy GPU's clock against it as well as against its node's median."))
GPU_RACK_LOAD_TRAYS = gauge("supernode_gpu_rack_load_trays", (
    "Compute trays under load (a fresh link vector with at least one busy GPU reporting its SM clock) counted in "
    "supernode_gpu_rack_median_sm_clock_hertz."))
GPU_RACK_THERMAL_RESISTANCE = gauge("supernode_gpu_thermal_resistance_rack_median_kelvin_per_watt", (
    "The rack's reference cold-plate thermal resistance for this tray's GPUs in K/W: the median R of the loaded "
    "GPUs of the OTHER trays on the same CDU at comparable flow, from their shared summaries "
    "(agent.coordination.tray_cooling); absent when no other tray reports one. cold_plate_degraded judges each "
    "loaded GPU against it as well as against its tray mates and its own baseline."), unit="kelvin_per_watt")
GPU_RACK_THERMAL_PEERS = gauge("supernode_gpu_thermal_resistance_rack_peers", (
    "Loaded GPUs of the other trays counted in supernode_gpu_thermal_resistance_rack_median_kelvin_per_watt "
    "(cold_plate_degraded uses that reference from remediation.detectors.cold_plate_min_peers of them)."))
FAMILIES = (NVLINK_SWITCH_FAULT, NVLINK_ATTRIBUTION_TRAYS, NVLINK_TRAY_SIDE_LINKS, GPU_RACK_MEDIAN_SM_CLOCK,
            GPU_RACK_LOAD_TRAYS, GPU_RACK_THERMAL_RESISTANCE, GPU_RACK_THERMAL_PEERS)
REFRESH_SECONDS = 5.0
INTERVAL = 0.5  # how often the verdict is published (its freshness), besides on every vector that changes it
HISTORY = 24  # vectors kept per tray: two minutes at one every 5 s (a derate looks back before its onset)
# An unchanged verdict is vouched fresh at each `publish` and published (the detectors run on it) at least this
# often: the 30 s clear hold of nvlink_switch_fault needs evaluations to run out, not one every 0.5 s (issue 38).
REPUBLISH_SECONDS = 2.0


class LinkShare:
    """Vectors of the rack's trays (this node's own and the others' as accepted) and the verdict over them."""

    def __init__(self, node: str, nodes: Iterable[str], detectors: Any, skew: float, switch_trays: Iterable[Any],
                 chips: int, clock: Callable[[], float] = time.time, refresh: float = REFRESH_SECONDS,
                 cooling: CoolingBuilder | None = None, loop_nodes: Iterable[str] = (), band_ratio: float = 0.1):
        self.node = node
        self.nodes = frozenset(nodes) | {node}
        self.attributing = chips > 0  # False: no NVLink domain, the vectors carry the trays' summaries only
        self.loop_nodes = frozenset(loop_nodes) | {node}  # the trays fed by this tray's CDU (a derate's rack)
        self.band_ratio = band_ratio
        self.min_trays = detectors.nvlink_switch_fault_min_trays
        self.skew = skew
        self.switch_trays = list(switch_trays)
        self.chips = chips
        self.clock = clock
        self.refresh = refresh
        self.max_age = 3 * refresh
        self.builder = VectorBuilder(node, detectors, cooling, links=self.attributing)
        self.vectors: dict[str, LinkVector] = {}
        self.store: Any = None
        self._sent: tuple[dict[str, str], float] | None = None  # the last vector put: (gpus, when)
        self.sent: LinkVector | None = None  # that vector: this tray as the others hold it
        # each tray's recent vectors (this tray's as sent), oldest first: a derate plans from the summaries sent
        # before the loop changed (`cooling_before`), which a transient has not reordered yet
        self.history: dict[str, deque[LinkVector]] = {}
        self.verdict: Attribution | None = None
        self._published: tuple[tuple, float] | None = None  # what the store holds: (its values, when published)

    @classmethod
    def of(cls, cfg: Any, nodes: Iterable[str], skew: float, clock: Callable[[], float]) -> "LinkShare | None":
        """This agent's share of the rack's tray vectors, or None for a rack of one tray. Where the rack is an
        NVLink domain (remediation.detectors.nvlink_switch_attribution: default on when inventory.switch_trays
        lists trays) it attributes NVLink failures too; elsewhere the vectors carry the load and cooling
        summaries only."""
        from agent.derived_thermal import supply_cdu

        nodes = frozenset(nodes)
        if not nodes - {cfg.agent.node}:
            return None
        detectors = cfg.remediation.detectors
        switch_trays = list(getattr(cfg.inventory, "switch_trays", None) or [])
        on = detectors.nvlink_switch_attribution
        domain = (bool(switch_trays) if on is None else on) and cfg.inventory.gpus.nvlinks_per_gpu
        inv, node = cfg.inventory, cfg.agent.node
        cdu = supply_cdu(inv, node)
        # the trays of this tray's loop; one whose CDU the inventory does not say may be on it too: counted, so
        # a derate never plans the rack without it (its summary, which says no CDU, never comes: per tray)
        loop = {n for n in nodes if cdu is not None and supply_cdu(inv, n) in (cdu, None)}
        return cls(node, nodes, detectors, skew, switch_trays if domain else [],
                   cfg.inventory.gpus.nvlinks_per_gpu if domain else 0, clock, cooling=CoolingBuilder(node, cdu),
                   loop_nodes=loop, band_ratio=cfg.sources.thermal_resistance.baseline_flow_band_ratio)

    def attach(self, store: Any, stale_after_intervals: float, interval: float = INTERVAL) -> None:
        """The verdict's source in the store, refreshed every `interval` (the coordination loop's: 1 s with etcd,
        0.5 s static); it stays fresh for at least 6 of them (a loop on a loaded host may be late), then ages out."""
        self.store = store
        store.register(SOURCE, DEVICE, interval, max(stale_after_intervals, 6.0))

    def own(self, snap: Any) -> bytes | None:
        """This node's vector from its own snapshot, taken at once; the bytes to put when it changed or is due."""
        now = self.clock()
        v = self.builder.build(snap, now)
        if v is None:
            return None
        self.vectors[self.node] = v
        if self._sent is not None and self._sent[0] == dict(v.gpus) and now - self._sent[1] < self.refresh:
            return None
        self._sent, self.sent = (dict(v.gpus), now), v
        self._remember(v)
        return encode(v)

    def _remember(self, v: LinkVector) -> None:
        if v.cool is not None:
            self.history.setdefault(v.node, deque(maxlen=HISTORY)).append(v)

    def resend(self) -> None:
        """Put the next vector whatever it holds (a new session: the old key went with the old lease)."""
        self._sent = None

    def accept(self, node: str, raw: bytes) -> LinkVector:
        """Another tray's vector, checked (link_vectors.decode: RecordError); its agent's lease is the caller's."""
        v = decode(raw, node, self.nodes, self.clock(), self.skew)
        if node != self.node:
            self.vectors[node] = v
            self._remember(v)
        return v

    def forget(self, node: str) -> None:
        if node != self.node:
            self.vectors.pop(node, None)

    def forget_peers(self) -> None:
        for node in [n for n in self.vectors if n != self.node]:
            del self.vectors[node]

    def publish(self, force: bool = False) -> Attribution:
        """The verdict now, into the store (and kept for the status of this agent). The same verdict as the one in
        the store is only vouched fresh (no detector runs), unless REPUBLISH_SECONDS passed or `force` (this
        agent's leadership changed: the rack incident is the leader's to open)."""
        now = self.clock()
        self.verdict = a = attribute(self.vectors, self.nodes, now, self.min_trays, self.max_age)
        if self.store is not None:
            readings = self.readings(a, now)
            values = tuple((r.spec.name, tuple(r.labels.items()), r.value) for r in readings)
            last = self._published
            if force or last is None or last[0] != values or not 0 <= now - last[1] < REPUBLISH_SECONDS \
                    or not self.store.touch(SOURCE, DEVICE):
                self.store.publish(SOURCE, DEVICE, readings, 0.0)
                self._published = (values, now)
        return a

    def cooling(self, now: float) -> dict[str, TrayCooling]:
        """The fresh cooling summaries of the rack's trays (node -> summary), this tray's latest included."""
        return {n: v.cool for n, v in self.vectors.items() if v.cool is not None and now - v.at <= self.max_age}

    def cooling_before(self, t: float) -> dict[str, TrayCooling]:
        """Each tray's summary as it sent it last at or before `t` (and no older than max_age then); this tray's
        as sent, so every agent that asks for the same `t` holds the same figures."""
        out = {}
        for node, past in self.history.items():
            v = next((v for v in reversed(past) if v.at <= t), None)
            if v is not None and v.cool is not None and t - v.at <= self.max_age:
                out[node] = v.cool
        return out

    def readings(self, a: Attribution, now: float) -> list[Any]:
        ok = Quality.OK
        out = []
        if self.attributing:
            out += [make_reading(NVLINK_SWITCH_FAULT, 1.0 if a.switch_side(k) else 0.0,
                                 {"switch_chip": str(k), "switch_tray": switch_tray_of(k, self.switch_trays)}, ok, now)
                    for k in range(self.chips)]
            for state, trays in (("counted", a.counted), ("stale", a.stale), ("silent", a.silent)):
                out.append(make_reading(NVLINK_ATTRIBUTION_TRAYS, float(len(trays)), {"state": state}, ok, now))
            out.append(make_reading(NVLINK_TRAY_SIDE_LINKS, float(len(a.tray_side)), {}, ok, now))
        rack_r = rack_resistance(self.node, self.cooling(now), self.band_ratio)
        if self.node in self.vectors and self.vectors[self.node].cool is not None:
            out.append(make_reading(GPU_RACK_THERMAL_PEERS, float(rack_r.gpus), {}, ok, now))
        if rack_r.median is not None:
            out.append(make_reading(GPU_RACK_THERMAL_RESISTANCE, rack_r.median, {}, ok, now))
        load = rack_load(self.vectors, now, self.max_age)
        out.append(make_reading(GPU_RACK_LOAD_TRAYS, float(len(load.trays)), {}, ok, now))
        if load.sm_clock_hertz is not None:
            out.append(make_reading(GPU_RACK_MEDIAN_SM_CLOCK, load.sm_clock_hertz, {}, ok, now))
        return out
