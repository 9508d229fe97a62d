"""A tray's NVLink state vector: per GPU, per link index, up / down / erroring; built, encoded and checked.

Why a record of its own (not a shared-device fact): the vector is the node's own (its GPUs, read by its own
agent), so only that node's agent may publish it, under `links/<node>` (etcd: a key only that node's role may
write, held under its member lease; agent.coordination.etcd_auth), and every agent reads every tray's to
attribute failures across the rack (agent.coordination.attribution). One character per link keeps an
18-link x 4-GPU tray at ~100 bytes.

The vector also carries the tray's load summary (`load`: how many of its GPUs are busy, their median SM clock
and power), so every agent knows the rack's median busy GPU (agent.coordination.rack_load) and a straggler
detector can see a whole tray running slow, which its own node's median never shows. It rides along: a
change of load alone does not put the vector again before its refresh. Optional, so an agent that does not
send it (or an older one) is read as before. And, likewise optional, the tray's cooling summary (`cool`: each
GPU's thermal resistance and margin, agent.coordination.tray_cooling), for the rack's cold-plate reference and
the derate by margin across trays. On a rack that is no NVLink domain the vector carries no links, only the
summaries.

What a reader takes is checked here (`decode`): the node is the key's, an inventory node; the time is a time
not ahead of the reader's clock by more than the allowed skew; at most MAX_GPUS GPUs of at most MAX_LINKS
links, each state one of "u", "d", "e"; a load summary, when present, of at most MAX_GPUS busy GPUs with a
clock and a power in physical range. Anything else is a RecordError naming the field.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from agent.coordination import tray_cooling
from agent.coordination.records import RecordError, as_object, parse_json, wall_time
from agent.coordination.tray_cooling import CoolingBuilder, TrayCooling

VERSION = 1
UP, DOWN, ERRORING = "u", "d", "e"
FAILING = frozenset((DOWN, ERRORING))
MAX_GPUS = 16
MAX_LINKS = 64
MAX_SM_CLOCK_HERTZ = 10e9  # far above any GPU's boost clock: a larger figure is no reading
MAX_GPU_POWER_WATTS = 10e3


@dataclass(frozen=True, slots=True)
class TrayLoad:
    """A tray's busy GPUs (utilisation at least gpu_straggler_min_utilization_ratio): how many, and their median
    SM clock and power (None when no busy GPU reported one)."""

    busy: int
    sm_clock_hertz: float | None
    power_watts: float | None


@dataclass(frozen=True, slots=True)
class LinkVector:
    node: str
    at: float  # the publisher's wall clock when it built the vector
    gpus: Mapping[str, str]  # gpu index -> one state character per link index
    load: TrayLoad | None = None  # the tray's busy GPUs, when its agent sends it
    cool: TrayCooling | None = None  # the tray's cooling summary (agent.coordination.tray_cooling), when sent

    def failing(self) -> list[tuple[str, int]]:
        return sorted((g, k) for g, links in self.gpus.items() for k, s in enumerate(links) if s in FAILING)


def encode(v: LinkVector) -> bytes:
    doc: dict[str, Any] = {"v": VERSION, "node": v.node, "at": v.at, "gpus": dict(v.gpus)}
    if v.load is not None:
        doc["load"] = {"n": v.load.busy, "sm": v.load.sm_clock_hertz, "w": v.load.power_watts}
    if v.cool is not None:
        doc["cool"] = tray_cooling.encode(v.cool)
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _decode_load(raw: Any) -> TrayLoad | None:
    if raw is None:
        return None
    doc = as_object(raw, "links.load")
    busy = doc.get("n")
    if not isinstance(busy, int) or isinstance(busy, bool) or not 0 <= busy <= MAX_GPUS:
        raise RecordError("type", f"links.load.n: expected a busy GPU count 0..{MAX_GPUS}")

    def figure(key: str, top: float) -> float | None:
        value = doc.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= top:
            raise RecordError("range", f"links.load.{key}: expected a number 0..{top:g} or null")
        return float(value)

    return TrayLoad(busy, figure("sm", MAX_SM_CLOCK_HERTZ), figure("w", MAX_GPU_POWER_WATTS))


def decode(raw: bytes | str, node: str, nodes: Iterable[str], now: float, skew: float) -> LinkVector:
    """The vector filed under `links/<node>`, checked (see the module doc); RecordError otherwise."""
    if node not in frozenset(nodes):
        raise RecordError("unknown_node", f"links/{node[:60]!r}: not a node of the rack's inventory")
    doc = as_object(parse_json(raw), "links")
    if doc.get("v") != VERSION:
        raise RecordError("version", f"links version {str(doc.get('v'))[:20]!r}, this agent reads {VERSION}")
    if doc.get("node") != node:
        raise RecordError("mismatch", f"links/{node}: the vector says node {str(doc.get('node'))[:60]!r}")
    at = wall_time(doc.get("at"), "links.at", now, skew)
    gpus = doc.get("gpus")
    if not isinstance(gpus, dict) or len(gpus) > MAX_GPUS:
        raise RecordError("type", f"links.gpus: expected an object of at most {MAX_GPUS} GPUs")
    for gpu, links in gpus.items():
        if not gpu.isdigit() or len(gpu) > 3:
            raise RecordError("type", f"links.gpus: {gpu[:20]!r} is not a GPU index")
        if not isinstance(links, str) or len(links) > MAX_LINKS or set(links) - {UP, DOWN, ERRORING}:
            raise RecordError("type", f"links.gpus.{gpu}: expected at most {MAX_LINKS} link states of u, d, e")
    return LinkVector(node, at, dict(gpus), _decode_load(doc.get("load")), tray_cooling.decode(doc.get("cool")))


class VectorBuilder:
    """This node's vector from its own snapshot: a link is down when `supernode_nvlink_up` reads 0, erroring
    when its effective BER is over `nvlink_effective_ber` or its counted errors rise faster than
    `nvlink_error_rate_per_second` (the local detector's thresholds, so both judge a link alike)."""

    def __init__(self, node: str, settings: Any, cooling: CoolingBuilder | None = None, links: bool = True):
        self.node = node
        self.s = settings
        self.cooling = cooling  # the tray's cooling summary rides along when set
        self.links = links  # False: the rack is no NVLink domain, the vector carries the summaries only
        self._last: dict[tuple[str, str, str], tuple[float, float, float]] = {}  # (gpu, link, type) -> (t, value, rate)

    def build(self, snap: Any, at: float) -> LinkVector | None:
        state: dict[str, dict[int, str]] = {}
        for r in snap.select("supernode_nvlink_up"):
            if r.ok and r.label("link").isdigit() and r.label("node", self.node) == self.node:
                state.setdefault(r.label("gpu"), {})[int(r.label("link"))] = UP if r.value >= 0.5 else DOWN
        if not self.links:
            state = {}
        elif not state:
            return None
        for gpu, link in self._erroring(snap):
            links = state.get(gpu)
            if links is not None and links.get(link) == UP:
                links[link] = ERRORING
        gpus = {g: "".join(links.get(k, UP) for k in range(max(links) + 1)) for g, links in state.items()
                if g.isdigit()}
        cool = self.cooling.build(snap) if self.cooling is not None else None
        if not self.links and cool is None:
            return None
        return LinkVector(self.node, at, gpus, self._load(snap), cool)

    def _load(self, snap: Any) -> TrayLoad:
        """This tray's busy GPUs and their medians (the straggler detector's notion of busy)."""
        def own(name: str, **labels: str) -> dict[str, float]:
            return {r.label("gpu"): r.value for r in snap.select(name, **labels)
                    if r.ok and r.label("node", self.node) == self.node}

        busy = {g for g, u in own("supernode_gpu_utilization_ratio", engine="gpu").items()
                if u >= self.s.gpu_straggler_min_utilization_ratio}
        clocks = [v for g, v in own("supernode_gpu_clock_hertz", clock="sm").items() if g in busy]
        power = [v for g, v in own("supernode_gpu_power_watts").items() if g in busy]
        return TrayLoad(len(busy), statistics.median(clocks) if clocks else None,
                        statistics.median(power) if power else None)

    def _erroring(self, snap: Any) -> set[tuple[str, int]]:
        out: set[tuple[str, int]] = set()
        for r in snap.select("supernode_nvlink_bit_error_rate", kind="effective"):
            if r.ok and r.label("link").isdigit() and r.value > self.s.nvlink_effective_ber:
                out.add((r.label("gpu"), int(r.label("link"))))
        types = set(self.s.nvlink_error_types)
        rates: dict[tuple[str, int], float] = {}
        for r in snap.select("supernode_nvlink_errors_total"):
            if not r.ok or r.label("type") not in types or not r.label("link").isdigit():
                continue
            key = (r.label("gpu"), r.label("link"), r.label("type"))
            prev = self._last.get(key)
            if prev is None or r.timestamp > prev[0]:  # a new sample (counters are read every few polls)
                rate = (r.value - prev[1]) / max(r.timestamp - prev[0], 1e-6) \
                    if prev is not None and r.value >= prev[1] else 0.0
                prev = self._last[key] = (r.timestamp, r.value, rate)
            link = (key[0], int(key[1]))
            rates[link] = rates.get(link, 0.0) + prev[2]
        out.update(k for k, rate in rates.items() if rate > self.s.nvlink_error_rate_per_second)
        return out
