"""A rack of real agent processes coordinated by a real etcd cluster, against the simulated rack (tests and bench)."""

from __future__ import annotations

import json
import re
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from agent.demo import agent_config
from tests.agentproc import AgentProcess
from tests.etcd import running_etcd
from tests.helpers import free_port, wait_for
from tests.simrack import SimRack

TOKEN = "coordination-test-token"


def coordinated_config(sim: Any, node: str, workdir: Path, endpoints: list[str], mode: str = "enforce",
                       slurm_conf: Path | None = None, ttl: float = 5.0, **guardrails: Any) -> dict[str, Any]:
    """A demo agent's config with an etcd `coordination` section and a light load (2-core test machine)."""
    (workdir / "admin.token").write_text(TOKEN + "\n")
    (workdir / "webhook.token").write_text(TOKEN + "\n")
    cfg = agent_config(sim, node, free_port(), workdir, mode=mode, slurm_conf=slurm_conf)
    cfg["sources"]["links"] = {"enabled": False}
    cfg["sources"]["dom"] = {"enabled": False}
    cfg["sources"]["nvml"].update(interval=2.0, timeout=1.5)
    cfg["coordination"] = {"backend": "etcd", "lease_ttl_seconds": ttl,
                           "etcd": {"endpoints": endpoints, "prefix": "/supernode-test"}}
    cfg["remediation"]["guardrails"].update(guardrails)
    return cfg


@contextmanager
def etcd_rack(base: Path, nodes: tuple[str, ...], ttl: float = 5.0) -> Iterator[tuple[Any, SimRack, list[AgentProcess]]]:
    """A 3-member etcd cluster, the simulated rack and one coordinated agent per node (the leader reads every
    tray: `watch_rack_trays`); everything stopped on the way out, a SIGSTOPped agent too."""
    gen = running_etcd(base / "etcd", 3)
    etcd = next(gen)
    sim = SimRack(base, nodes=len(nodes), gpus=2).start()
    agents: list[AgentProcess] = []
    try:
        for node in nodes:
            work = base / node
            work.mkdir()
            cfg = coordinated_config(sim.sim, node, work, etcd.endpoints, ttl=ttl)
            cfg["sources"]["redfish"]["watch_rack_trays"] = True
            agents.append(AgentProcess(cfg, work).start())
        yield etcd, sim, agents
    finally:
        for a in agents:
            if a.proc is not None and a.proc.poll() is None:
                a.proc.send_signal(signal.SIGCONT)
            a.stop()
        sim.stop()
        try:
            next(gen)
        except StopIteration:
            pass


def static_configs(sim: Any, base: Path, nodes: list[str], pollers: dict[str, list[str]]
                   ) -> list[tuple[dict[str, Any], Path]]:
    """(config, workdir) of each node's agent with `static` coordination: each shared device polled by the nodes
    `pollers` names for it; the other nodes read those pollers' fact streams at `inventory.agent_urls`."""
    cfgs = []
    for node in nodes:
        work = base / node
        work.mkdir(parents=True, exist_ok=True)
        cfgs.append((coordinated_config(sim, node, work, ["http://127.0.0.1:9"]), work))
    urls = {cfg["agent"]["node"]: f"http://127.0.0.1:{cfg['listen']['port']}" for cfg, _ in cfgs}
    for cfg, _ in cfgs:
        cfg["inventory"]["agent_urls"] = urls
        cfg["coordination"] = {"backend": "static", "pollers": pollers}
    return cfgs


def metric(agent: AgentProcess, name: str, **labels: str) -> float | None:
    status, body = agent.get("/metrics")
    if status != 200:
        return None
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    m = re.search(rf"^{re.escape(name)}(?:{{{re.escape(want)}}})? (\S+)$" if want else
                  rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", body.decode(), re.M)
    return float(m.group(1)) if m else None


def is_leader(agent: AgentProcess) -> bool:
    return metric(agent, "supernode_coordination_leader", backend="etcd") == 1.0


def is_up(agent: AgentProcess) -> bool:
    return metric(agent, "supernode_coordination_up", backend="etcd") == 1.0


def leaders(agents: list[AgentProcess]) -> list[AgentProcess]:
    return [a for a in agents if a.proc is not None and a.proc.poll() is None and is_leader(a)]


def polls(agent: AgentProcess, device: str) -> bool:
    return metric(agent, "supernode_coordination_polling", device=device) == 1.0


def journal(agent: AgentProcess) -> list[dict[str, Any]]:
    status, body = agent.get("/api/v1/journal?limit=2000", token=TOKEN)
    return json.loads(body)["entries"] if status == 200 else []


def incidents(agent: AgentProcess) -> dict[str, Any]:
    status, body = agent.get("/api/v1/incidents", token=TOKEN)
    return json.loads(body) if status == 200 else {}


def approve(agent: AgentProcess, ident: str) -> list[str]:
    status, body = agent.request("POST", f"/api/v1/incidents/{ident}/approve", token=TOKEN)
    return json.loads(body).get("approved", []) if status == 200 else []


def results(agent: AgentProcess, action: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in journal(agent) if e.get("action") == action and e.get("kind") in ("result", "blocked")
            and all(e.get(k) == v for k, v in match.items())]


def alive(agents: list[AgentProcess]) -> list[AgentProcess]:
    return [a for a in agents if a.proc is not None and a.proc.poll() is None]


def restart(agent: AgentProcess) -> None:
    """Start an agent again after a kill, on the same config and state dir."""
    if agent.proc is not None and agent.proc.poll() is None:
        agent.proc.send_signal(signal.SIGCONT)
        agent.stop()
    agent.start()
    wait_for(lambda: is_up(agent), 40, what=f"{agent.config['agent']['node']} coordinating again")
