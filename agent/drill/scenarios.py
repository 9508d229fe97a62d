"""The faults a drill can fake, each checked against the rack before it starts.

Why each scenario names the nodes it acts on: a plan lists the only nodes the drill may touch, so the drill
must know, before it injects anything, every node the agent's playbook for that fault will act on (a zone's
nodes, a tray and the trays below it, the node of a GPU, the nodes whose GPUs a flow loss caps). A plan that
leaves one out is refused naming it, never run to find out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from agent.remediation.leak_scope import trays_below


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LeakScenario(_Strict):
    kind: Literal["leak"]
    zone: str = Field(min_length=1, description="the leak zone (inventory.leak_zones) whose sensor reads wet")


class TrayLeakScenario(_Strict):
    kind: Literal["tray_leak"]
    node: str = Field(min_length=1, description="this agent's compute tray (its node), whose own BMC detector "
                      "reads wet; the trays watched below it (inventory.rack_units) are drained too")


class XidScenario(_Strict):
    kind: Literal["xid"]
    node: str = Field(min_length=1, description="this agent's node: the XID enters as its NVML source's would")
    gpu: int = Field(ge=0)
    xid: int = Field(ge=1, description="the XID the GPU reports (its class comes from the XID catalogue)")


class LinkDownScenario(_Strict):
    kind: Literal["link_down"]
    node: str = Field(min_length=1, description="this agent's node")
    gpu: int = Field(ge=0)
    link: int = Field(ge=0, description="the NVLink that reads down (one this agent reads)")


class FlowLossScenario(_Strict):
    kind: Literal["flow_loss"]
    cdu: str = Field(min_length=1, description="the CDU (inventory.cdus, Modbus) whose secondary flow drops")
    loss: float = Field(default=0.5, gt=0, lt=1, description="the share of the flow lost (0.5: half the flow); "
                        "the return temperature rises as the same heat is carried by less coolant")


class SwitchFaultScenario(_Strict):
    kind: Literal["switch_fault"]
    switch_chip: int = Field(ge=0, description="the NVSwitch chip the rack's attribution blames")
    switch_tray: str = Field(default="", description="its switch tray (inventory.switch_trays), if known")


Scenario = Annotated[Union[LeakScenario, TrayLeakScenario, XidScenario, LinkDownScenario, FlowLossScenario,
                           SwitchFaultScenario], Field(discriminator="kind")]
AnyScenario = Union[LeakScenario, TrayLeakScenario, XidScenario, LinkDownScenario, FlowLossScenario,
                    SwitchFaultScenario]


@dataclass(frozen=True)
class Rack:
    """What the agent knows of its rack, as the scenario checks need it (from the inventory)."""

    node: str  # this agent's
    nodes: list[str] = field(default_factory=list)
    zones: dict[str, list[str]] = field(default_factory=dict)
    tray_bmcs: dict[str, str] = field(default_factory=dict)  # node -> its tray BMC (Redfish, kind tray)
    below: dict[str, list[str]] = field(default_factory=dict)  # node -> the trays watched below it
    cdus: list[str] = field(default_factory=list)


def describe(sc: AnyScenario) -> str:
    """The scenario in words, for the page's banner and the report's header."""
    if isinstance(sc, LeakScenario):
        return f"leak in zone {sc.zone}"
    if isinstance(sc, TrayLeakScenario):
        return f"leak in tray {sc.node}"
    if isinstance(sc, XidScenario):
        return f"XID {sc.xid} on {sc.node} GPU {sc.gpu}"
    if isinstance(sc, LinkDownScenario):
        return f"NVLink {sc.link} of {sc.node} GPU {sc.gpu} down"
    if isinstance(sc, FlowLossScenario):
        return f"{sc.loss:.0%} of {sc.cdu}'s secondary flow lost"
    return f"NVSwitch chip {sc.switch_chip}{' of ' + sc.switch_tray if sc.switch_tray else ''} failed"


def acted_on(sc: AnyScenario, rack: Rack) -> list[str]:
    """The nodes the agent's playbook for this fault acts on; ValueError naming the field where the fault cannot
    be faked on this rack by this agent."""
    if isinstance(sc, LeakScenario):
        if sc.zone not in rack.zones:
            raise ValueError(f"scenario.zone: {sc.zone!r} is not a leak zone of this rack "
                             f"({', '.join(rack.zones) or 'none'})")
        return list(rack.zones[sc.zone])
    if isinstance(sc, TrayLeakScenario):
        if sc.node != rack.node:
            raise ValueError(f"scenario.node: {sc.node} is not this agent's node ({rack.node}): a tray's detectors "
                             "are read by its own agent; run the drill on that node's agent")
        if sc.node not in rack.tray_bmcs:
            raise ValueError(f"scenario.node: {sc.node} has no tray BMC in this rack's inventory (inventory.redfish, "
                             "kind tray)")
        return [sc.node, *(n for n in rack.below.get(sc.node, []) if n in rack.nodes)]
    if isinstance(sc, (XidScenario, LinkDownScenario)):
        if sc.node != rack.node:
            raise ValueError(f"scenario.node: {sc.node} is not this agent's node ({rack.node}): a GPU fault enters "
                             "where that node's NVML source reads it; run the drill on that node's agent")
        return [sc.node]
    if isinstance(sc, FlowLossScenario):
        if sc.cdu not in rack.cdus:
            raise ValueError(f"scenario.cdu: {sc.cdu!r} is not a Modbus CDU of this rack ({', '.join(rack.cdus) or 'none'})")
        return [rack.node]  # the coolant playbook caps this agent's own GPUs
    return []  # a switch fault drains nothing (nvlink-switch-fault notifies which switch tray to service)


def rack_wide(sc: AnyScenario) -> bool:
    """A fault every endangered node's agent acts on, each on its own node: a zone leak (its sensor's poll
    reaches every agent of the rack). The others are read and acted on by one agent (a tray's own BMC, a GPU's
    NVML, the CDU's flow on the agent that caps, the rack's switch verdict on its leader)."""
    return isinstance(sc, LeakScenario)


def participants(sc: AnyScenario, rack: Rack) -> list[str]:
    """The nodes whose agents take part in a drill of `sc` started on `rack.node`'s agent: for a rack-wide
    fault every node it acts on (each agent injects it into its own store and drains its own node), else the
    drilling agent's own node."""
    return acted_on(sc, rack) if rack_wide(sc) else [rack.node]


def zone_of(node: str, rack: Rack) -> str:
    """The leak zone a node is in (a tray leak's readings carry it), or '' when none lists it."""
    return next((z for z, nodes in rack.zones.items() if node in nodes), "")


def rack_of(inventory: Any, node: str, watch_below: int) -> Rack:
    """The scenario checks' view of the agent's inventory (`watch_below`: remediation.leak_scope's)."""
    trays = {e.node: e.name for e in getattr(inventory, "redfish", []) if e.kind == "tray" and e.node}
    units = dict(getattr(inventory, "rack_units", {}) or {})
    return Rack(node=node, nodes=list(inventory.nodes), zones={z.name: list(z.nodes) for z in inventory.leak_zones},
                tray_bmcs=trays, below={t: trays_below(units, t, watch_below) for t in trays},
                cdus=[c.name for c in getattr(inventory, "cdus", [])])


def mitigation(sc: AnyScenario, xid_class: Callable[[int], str]) -> str:
    """The action the agent's playbook mitigates this fault with (the report's stage: drained, capped, notified,
    job_notified); an XID by its ladder class (`xid_class`, the engine's judge). ValueError for an XID the ladder
    does not act on."""
    if isinstance(sc, FlowLossScenario):
        return "gpu_power_cap"
    if isinstance(sc, SwitchFaultScenario):
        return "notify"
    if isinstance(sc, XidScenario):
        klass = xid_class(sc.xid)
        if klass == "app":
            return "job_notify"
        if klass not in ("reset", "reboot"):
            raise ValueError(f"scenario.xid: XID {sc.xid} is of class {klass}: a drill fakes the app, reset and reboot "
                             "classes (a service-class drain stays until a person visits the GPU)")
    return "drain"
