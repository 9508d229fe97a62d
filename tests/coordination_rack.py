"""A rack of real agent processes coordinated by a real etcd cluster, against the simulated rack (tests and bench)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any, Callable, Iterator

from sim.demo import agent_config
from sim.etcd_cluster import EtcdCluster
from tests.agentproc import AgentProcess
from tests.etcd import running_etcd
from tests.helpers import free_port, wait_for
from sim.harness import SimRack

TOKEN = "coordination-test-token"
NODES = ("node01", "node02", "node03")
SHARED = ("leak1", "cdu1", "rdhx1", "pdu-a", "rfcdu1", "bmc-switch01")  # a switch tray BMC: shared (issue 34)
TTL = 5.0


class EtcdRack:
    """Three agents on the simulated rack, coordinated by a real 3-member etcd cluster (a module's fixture)."""

    def __init__(self, etcd, sim: SimRack, agents: list[AgentProcess]):
        self.etcd, self.sim, self.agents = etcd, sim, agents
        self.root = f"/supernode-test/{agents[0].config['agent']['rack']}"

    def by_node(self, node: str) -> AgentProcess:
        return next(a for a in self.agents if a.config["agent"]["node"] == node)

    def device(self, name: str):
        return self.sim.sim.devices[name]

    def steady(self) -> None:
        """Every agent up, one leader, every shared device polled by two agents."""
        wait_for(lambda: all(is_up(a) for a in self.agents), 60, what="every agent coordinating")
        wait_for(lambda: len(leaders(self.agents)) == 1, 60, what="one leader")
        wait_for(lambda: all(sum(polls(a, d) for a in self.agents) == 2 for d in SHARED), 60,
                 what="two pollers per shared device")

    def leader(self) -> AgentProcess:
        """The one leader, once there is exactly one (a lease may lapse and be taken again between two looks on a
        loaded host: never the first of a list read once)."""
        return wait_for(lambda: (ls := leaders(self.agents)) and len(ls) == 1 and ls[0], 60, what="one leader")

    def clear(self) -> None:
        """The simulated faults cleared and every running agent's leak incidents resolved (an agent a test killed
        answers nothing: asking it would fail, as it should, so it is not asked)."""
        self.sim.clear()
        wait_for(lambda: not any(i["detector"] == "leak" for a in alive(self.agents) for i in incidents(a).get("open", [])),
                 60, what="leak incidents resolved everywhere")


def etcd_rack(base: Path, configure: Callable[[dict[str, Any], str, Any], None] | None = None,
              rack: type[EtcdRack] = EtcdRack, personality: str | None = None) -> Iterator[EtcdRack]:
    """A steady EtcdRack for a module fixture (`yield from` it); `configure(cfg, node, sim)` adjusts each agent's
    config before it starts. Everything is stopped afterwards, a stopped (SIGSTOP) agent included."""
    gen = running_etcd(base / "etcd", 3)
    etcd = next(gen)
    sim = SimRack(base, nodes=3, gpus=2, **({"personality": personality} if personality else {})).start()
    agents: list[AgentProcess] = []
    try:
        for node in NODES:
            work = base / node
            work.mkdir()
            cfg = coordinated_config(sim.sim, node, work, etcd.endpoints, ttl=TTL)
            if configure is not None:
                configure(cfg, node, sim.sim)
            agents.append(AgentProcess(cfg, work).start())
        r = rack(etcd, sim, agents)
        r.steady()
        yield r
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


def coordinated_config(sim: Any, node: str, workdir: Path, endpoints: list[str], mode: str = "enforce",
                       slurm_conf: Path | None = None, ttl: float = 5.0, **guardrails: Any) -> dict[str, Any]:
    """A demo agent's config with an etcd `coordination` section and a light load (2-core test machine).

    `endpoints` of one of our test clusters: the agent connects as its node's own etcd user (`authorize`)."""
    (workdir / "admin.token").write_text(TOKEN + "\n")
    (workdir / "webhook.token").write_text(TOKEN + "\n")
    cfg = agent_config(sim, node, free_port(), workdir, mode=mode, slurm_conf=slurm_conf)
    cfg["sources"]["links"] = {"enabled": False}
    cfg["sources"]["dom"] = {"enabled": False}
    cfg["sources"]["nvml"].update(interval=2.0, timeout=1.5)
    cfg["coordination"] = {"backend": "etcd", "lease_ttl_seconds": ttl,
                           "etcd": {"endpoints": endpoints, "prefix": "/supernode-test"}}
    cfg["remediation"]["guardrails"].update(guardrails)
    cluster = EtcdCluster.serving(endpoints)
    if cluster is not None:  # our test etcd (auth and TLS on): this node's own user, password file, CA
        cluster.authorize(cfg, workdir)
    return cfg


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


def static_rack(base: Path, nodes: list[str], pollers: dict[str, list[str]],
                configure: Callable[[dict[str, Any]], None] | None = None, personality: str | None = None
                ) -> Iterator[tuple[SimRack, list[AgentProcess]]]:
    """(simulated rack, started agents) of a `static` rack (static_configs) for a fixture (`yield from` it);
    `configure(cfg)` adjusts each agent's config before it starts. Everything is stopped afterwards."""
    sim = SimRack(base, nodes=len(nodes), gpus=2, **({"personality": personality} if personality else {})).start()
    agents: list[AgentProcess] = []
    try:
        for cfg, work in static_configs(sim.sim, base, nodes, pollers):
            if configure is not None:
                configure(cfg)
            agents.append(AgentProcess(cfg, work).start())
        yield sim, agents
    finally:
        for a in agents:
            a.stop()
        sim.stop()


def _answer(agent: AgentProcess, method: str, path: str, token: str | None = None) -> bytes:
    """The body of a 200 answer. Anything else fails the test: a refusal or an error is never "nothing there"
    (and no answer at all raises AgentUnreachable in AgentProcess.request)."""
    status, body = agent.request(method, path, token=token)
    assert status == 200, f"{agent.config['agent']['node']}: {method} {path}: HTTP {status} {body[:300]!r}"
    return body


def metric(agent: AgentProcess, name: str, **labels: str) -> float | None:
    """The value of a series on the agent's /metrics; None only when the agent answered without that series."""
    body = _answer(agent, "GET", "/metrics")
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
    return json.loads(_answer(agent, "GET", "/api/v1/journal?limit=2000", token=TOKEN))["entries"]


def incidents(agent: AgentProcess) -> dict[str, Any]:
    return json.loads(_answer(agent, "GET", "/api/v1/incidents", token=TOKEN))


def approve(agent: AgentProcess, ident: str) -> list[str]:
    return json.loads(_answer(agent, "POST", f"/api/v1/incidents/{ident}/approve", token=TOKEN)).get("approved", [])


def approval_refused(agent: AgentProcess, ident: str) -> str:
    """The agent's refusal of an approval by `ident` (404: nothing pending under it); fails if it approved."""
    status, body = agent.request("POST", f"/api/v1/incidents/{ident}/approve", token=TOKEN)
    assert status == 404, f"approve {ident}: HTTP {status} {body[:300]!r}"
    return json.loads(body)["error"]


def results(agent: AgentProcess, action: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in journal(agent) if e.get("action") == action and e.get("kind") in ("result", "blocked")
            and all(e.get(k) == v for k, v in match.items())]


def set_maintenance(agent: AgentProcess, node: str, on: bool) -> dict:
    """A person puts `node` in maintenance (or ends it) on `agent`; the maintenance view it answers."""
    status, body = agent.request("POST", "/api/v1/maintenance", body={"node": node, "on": on}, token=TOKEN)
    assert status == 200, body
    return json.loads(body)["maintenance"]


def xid_alert(agent: AgentProcess, node: str, status: str, starts: str) -> int:
    """One Alertmanager delivery (payload version 4) about a critical XID on `node`, to `agent`'s webhook."""
    alert = {"status": status, "labels": {"alertname": "SupernodeGpuLost", "detector": "gpu_lost",
                                          "node": node, "severity": "critical"},
             "annotations": {}, "startsAt": starts, "fingerprint": f"xid-{node}-{starts}",
             "endsAt": "2026-12-01T01:00:00Z" if status == "resolved" else "0001-01-01T00:00:00Z"}
    body = {"version": "4", "status": status, "receiver": "agent", "groupKey": "{}", "alerts": [alert]}
    return agent.request("POST", "/api/v1/alerts", body=body, token=TOKEN)[0]


def alive(agents: list[AgentProcess]) -> list[AgentProcess]:
    return [a for a in agents if a.proc is not None and a.proc.poll() is None]


def restart(agent: AgentProcess) -> None:
    """Start an agent again after a kill, on the same config and state dir."""
    if agent.proc is not None and agent.proc.poll() is None:
        agent.proc.send_signal(signal.SIGCONT)
        agent.stop()
    agent.start()
    wait_for(lambda: is_up(agent), 40, what=f"{agent.config['agent']['node']} coordinating again")
