"""Fault kinds the simulator can inject, each a validated parameter list and a function.

Kinds register here with their parameters, so the API refuses a bad
injection with a message that names the parameter, and `sim inject --help`
lists what exists. Every kind records how to undo itself, so `sim clear`
returns the rack to nominal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from agent.sim.server import Simulator


class FaultError(ValueError):
    """A bad injection request; the message names the parameter."""


@dataclass(frozen=True)
class Param:
    name: str
    type: type = str
    required: bool = False
    default: Any = None
    help: str = ""


@dataclass(frozen=True)
class FaultKind:
    name: str
    help: str
    apply: Callable[["Simulator", dict[str, Any]], str]
    params: tuple[Param, ...] = field(default_factory=tuple)

    def parse(self, raw: dict[str, Any]) -> dict[str, Any]:
        known = {p.name for p in self.params}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise FaultError(f"{self.name}: unknown parameter(s) {', '.join(unknown)}; "
                             f"expected {', '.join(sorted(known)) or 'none'}")
        out: dict[str, Any] = {}
        for p in self.params:
            if p.name not in raw or raw[p.name] is None:
                if p.required:
                    raise FaultError(f"{self.name}: parameter {p.name!r} is required ({p.help})")
                out[p.name] = p.default
                continue
            try:
                out[p.name] = p.type(raw[p.name])
            except (TypeError, ValueError):
                raise FaultError(f"{self.name}: parameter {p.name!r} expects {p.type.__name__}, "
                                 f"got {raw[p.name]!r}") from None
        return out


REGISTRY: dict[str, FaultKind] = {}


def fault(name: str, help: str, *params: Param) -> Callable[[Callable[["Simulator", dict[str, Any]], str]], Callable]:
    def deco(fn: Callable[["Simulator", dict[str, Any]], str]) -> Callable:
        REGISTRY[name] = FaultKind(name, help, fn, tuple(params))
        return fn
    return deco


NODE = Param("node", str, False, None, "node name (default: the first node)")
GPU = Param("gpu", int, False, 0, "GPU index")


def _gpu(sim: "Simulator", p: dict[str, Any]):
    node = p.get("node") or next(iter(sim.model.nodes))
    if node not in sim.model.nodes:
        raise FaultError(f"node: {node!r} is not a simulated node ({', '.join(sim.model.nodes)})")
    gpus = sim.model.nodes[node].gpus
    idx = p.get("gpu", 0) or 0
    if not 0 <= idx < len(gpus):
        raise FaultError(f"gpu: {idx} out of range 0..{len(gpus) - 1}")
    return gpus[idx]


@fault("gpu-lost", "GPU falls off the bus: every NVML call on it answers GPU_IS_LOST.", NODE, GPU)
def _gpu_lost(sim: "Simulator", p: dict[str, Any]) -> str:
    with sim.model.lock:
        g = _gpu(sim, p)
        g.lost = True
    return f"{g.node} gpu {g.index} lost"


@fault("xid", "Raise an XID event on a GPU.", NODE, GPU, Param("code", int, True, None, "XID number"))
def _xid(sim: "Simulator", p: dict[str, Any]) -> str:
    g = _gpu(sim, p)
    sim.model.raise_xid(g.node, g.index, p["code"])
    return f"{g.node} gpu {g.index} xid {p['code']}"


@fault("nvlink-errors", "NVLink CRC/replay errors at a rate (per second) on one link.", NODE, GPU,
       Param("link", int, False, 0, "NVLink index"), Param("rate", float, False, 100.0, "errors per second"))
def _nvlink(sim: "Simulator", p: dict[str, Any]) -> str:
    with sim.model.lock:
        g = _gpu(sim, p)
        if not 0 <= p["link"] < g.nvlink_count:
            raise FaultError(f"link: {p['link']} out of range 0..{g.nvlink_count - 1}")
        g.nvlink_error_rate[p["link"]] = p["rate"]
    return f"{g.node} gpu {g.index} link {p['link']} errors {p['rate']}/s"


@fault("thermal", "Blocked cold plate: the GPU runs this much hotter (default: into HW slowdown).", NODE, GPU,
       Param("celsius", float, False, 30.0, "extra degrees"))
def _thermal(sim: "Simulator", p: dict[str, Any]) -> str:
    with sim.model.lock:
        g = _gpu(sim, p)
        g.thermal_extra_c = p["celsius"]
    return f"{g.node} gpu {g.index} +{p['celsius']} C"


@fault("gpu-hang", "NVML calls on the GPU block (a wedged driver).", NODE, GPU,
       Param("seconds", float, False, 30.0, "how long each call blocks"))
def _hang(sim: "Simulator", p: dict[str, Any]) -> str:
    with sim.model.lock:
        g = _gpu(sim, p)
        g.hang_seconds = p["seconds"]
    return f"{g.node} gpu {g.index} hangs {p['seconds']}s per call"


@fault("workload", "Set the GPU workload (fraction of the default power limit the job would draw).", NODE,
       Param("gpu", int, False, None, "GPU index (default: all GPUs of the node, or of the rack without --node)"),
       Param("ratio", float, True, None, "0..1"))
def _workload(sim: "Simulator", p: dict[str, Any]) -> str:
    if not 0.0 <= p["ratio"] <= 1.0:
        raise FaultError("ratio: expected 0..1")
    with sim.model.lock:
        nodes = [p["node"]] if p["node"] else list(sim.model.nodes)
        for n in nodes:
            if n not in sim.model.nodes:
                raise FaultError(f"node: {n!r} is not a simulated node")
            for g in sim.model.nodes[n].gpus:
                if p["gpu"] is None or g.index == p["gpu"]:
                    g.workload = p["ratio"]
    return f"workload {p['ratio']}"
