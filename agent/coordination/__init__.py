"""Rack coordination: who polls the rack's shared devices, who leads it, and rack-wide guardrails.

The runtime talks to one coordinator through a narrow interface:
`gate_runners` (which shared sources this agent polls now), `hidden` (shared
sources whose store entry holds another agent's facts, not exported here),
`start`/`stop`, and `rack` (what remediation asks: leader, rack guardrails,
approvals, fencing). `static` answers from the config (agent.coordination.static),
`etcd` from a real etcd cluster (agent.coordination.etcd_rack).
"""

from __future__ import annotations

from typing import Any, Iterator

from agent.coordination.records import REJECTED_RECORDS
from exporters.model import counter, gauge

COORDINATION_UP = gauge("supernode_coordination_up", (
    "1 while this agent coordinates with its rack (static: always; etcd: its lease proven alive), 0 while "
    "degraded: it acts on its own node only and polls the leak inputs itself."), ("backend",))
COORDINATION_LEADER = gauge("supernode_coordination_leader", (
    "1 on the agent that leads its rack (drives the shared valves and outlets), 0 on the others."), ("backend",))
COORDINATION_POLLING = gauge("supernode_coordination_polling", (
    "1 while this agent polls that shared rack device itself (and exports its series), 0 while it reads "
    "another agent's polls of it."), ("device",))
COORDINATION_MEMBERS = gauge("supernode_coordination_members", "Agents of the rack alive in etcd, as this agent sees them.")
COORDINATION_FENCED = counter("supernode_coordination_fenced_total", (
    "Shared actuator writes refused because this agent could not prove it leads the rack."))
COORDINATION_NO_LEADER = gauge("supernode_coordination_no_leader_seconds", (
    "etcd: how long this agent, coordinating, has seen no rack leader (a leader key held under a current "
    "member's live lease); 0 while it sees one or while it is degraded. Shared steps (valves, outlets) wait "
    "for a leader meanwhile."))
COORDINATION_LEASE_TTL = gauge("supernode_coordination_lease_ttl_seconds", (
    "etcd: the lease TTL of this agent's membership, leadership and poller slots (coordination.lease_ttl_seconds)."))
COORDINATION_FACTS = counter("supernode_coordination_facts_total", (
    "Shared-device polls published to the rack (direction=out), taken from another poller (in), or not published "
    "(withheld: nothing a detector reads changed since the last one out and no heartbeat was due, "
    "coordination.fact_heartbeat_seconds)."), ("direction",))


def build_coordinator(loaded) -> Any:
    """The coordinator a config asks for; no `coordination` section behaves as `static` with no pollers list."""
    coord = loaded.config.coordination
    if coord is not None and coord.backend == "etcd":
        from agent.coordination.etcd_rack import EtcdCoordinator

        return EtcdCoordinator(loaded)
    from agent.coordination.static import StaticCoordinator

    return StaticCoordinator(loaded)


class CoordinationCollector:
    """The coordination families of whichever coordinator the agent runs."""

    def __init__(self, coordinator: Any):
        self.c = coordinator

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self.c
        up = GaugeMetricFamily(COORDINATION_UP.name, COORDINATION_UP.help, labels=["backend"])
        up.add_metric([c.backend], 1.0 if c.up() else 0.0)
        leader = GaugeMetricFamily(COORDINATION_LEADER.name, COORDINATION_LEADER.help, labels=["backend"])
        leader.add_metric([c.backend], 1.0 if c.is_leader() else 0.0)
        yield up
        yield leader
        polling = c.polling()
        if polling:
            fam = GaugeMetricFamily(COORDINATION_POLLING.name, COORDINATION_POLLING.help, labels=["device"])
            for device, on in sorted(polling.items()):
                fam.add_metric([device], 1.0 if on else 0.0)
            yield fam
        if c.backend == "etcd":
            yield GaugeMetricFamily(COORDINATION_MEMBERS.name, COORDINATION_MEMBERS.help, value=len(c.members()))
            yield GaugeMetricFamily(COORDINATION_NO_LEADER.name, COORDINATION_NO_LEADER.help,
                                    value=c.no_leader_seconds())
            yield GaugeMetricFamily(COORDINATION_LEASE_TTL.name, COORDINATION_LEASE_TTL.help, value=c.ttl)
            yield CounterMetricFamily(COORDINATION_FENCED.name, COORDINATION_FENCED.help, value=c.fenced_total)
            facts = CounterMetricFamily(COORDINATION_FACTS.name, COORDINATION_FACTS.help, labels=["direction"])
            facts.add_metric(["out"], c.facts_published)
            facts.add_metric(["in"], c.facts_received)
            facts.add_metric(["withheld"], c.facts.withheld)
            yield facts
        rejected = CounterMetricFamily(REJECTED_RECORDS.name, REJECTED_RECORDS.help, labels=["key_kind", "why"])
        for (kind, why), n in sorted(c.rejections.counts.items()):
            rejected.add_metric([kind, why], n)
        yield rejected
