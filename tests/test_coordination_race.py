"""Rack-wide blast radius: three agents fire drains at the same instant against a real Slurm; etcd counts them.

Every zone of the rack goes wet at once, so each agent learns of its own zone's leak from the same
etcd watch event and asks to drain its own node at the same moment. `max_drained_nodes: 1`: exactly
one drain may pass; the others are blocked (`blast_radius`), counted rack-wide, whatever the timing.
The drained count is read from Slurm itself, over the whole episode, not only at the end.
"""

from __future__ import annotations

import threading

import pytest

from tests.agentproc import AgentProcess
from tests.coordination_rack import coordinated_config, is_up, leaders, results
from tests.etcd import running_etcd
from tests.helpers import wait_for
from sim.harness import SimRack
from tests.slurm import running_cluster

NODES = ["node01", "node02", "node03"]


@pytest.fixture(scope="module")
def slurm():
    yield from running_cluster(NODES)


def test_agents_racing_to_drain_never_pass_the_rack_limit(tmp_path, slurm):
    etcd_gen = running_etcd(tmp_path / "etcd", 1)
    etcd = next(etcd_gen)
    sim = SimRack(tmp_path, nodes=3, gpus=2).start()
    agents: list[AgentProcess] = []
    seen: list[int] = []
    stop = threading.Event()

    def watch_slurm() -> None:  # the drained count as Slurm shows it, sampled over the whole episode
        while not stop.is_set():
            states = slurm.states()
            seen.append(sum(1 for n in NODES if "drain" in states.get(n, "") or "down" in states.get(n, "")))
            stop.wait(0.05)

    try:
        for node in NODES:
            work = tmp_path / node
            work.mkdir()
            cfg = coordinated_config(sim.sim, node, work, etcd.endpoints, slurm_conf=slurm.conf,
                                     max_drained_nodes=1, max_drained_fraction=1.0)
            agents.append(AgentProcess(cfg, work).start())
        wait_for(lambda: all(is_up(a) for a in agents) and len(leaders(agents)) == 1, 60, what="rack coordinating")
        sampler = threading.Thread(target=watch_slurm, daemon=True)
        sampler.start()
        model = sim.sim.model
        with model.lock:  # every zone wet in the same instant
            for zone in model.coolant.leak_zones:
                model.coolant.leak_zones[zone] = "wet"

        def decided(a: AgentProcess) -> bool:
            node = a.config["agent"]["node"]
            return bool(results(a, "drain", target=f"node={node}"))
        wait_for(lambda: all(decided(a) for a in agents), 60, what="every agent decided its drain")
        stop.set()
        sampler.join(5)
        done = [a for a in agents if results(a, "drain", result="done")]
        blocked = [a for a in agents if any(e["detail"].get("guardrail") == "blast_radius"
                                            for e in results(a, "drain", result="blocked"))]
        assert len(done) == 1, [results(a, "drain") for a in agents]
        assert len(blocked) == 2, [results(a, "drain") for a in agents]
        assert max(seen) <= 1, f"Slurm showed {max(seen)} drained nodes at once"
        states = slurm.states()
        assert sum(1 for n in NODES if "drain" in states.get(n, "")) == 1, states
        why = next(e for e in results(blocked[0], "drain", result="blocked"))["detail"]["why"]
        assert "max_drained_nodes is 1" in why, why
    finally:
        stop.set()
        for a in agents:
            a.stop()
        sim.stop()
        for node in NODES:
            slurm.scontrol("update", f"NodeName={node}", "State=RESUME")
        try:
            next(etcd_gen)
        except StopIteration:
            pass
