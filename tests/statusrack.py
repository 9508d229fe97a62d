"""A simulated rack with one real agent process per node, each knowing the others' URLs (as `make demo` runs
them): what the status page tests and the README screenshot drive."""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from sim.demo import agent_config
from tests.agentproc import AgentProcess
from tests.helpers import free_port, wait_for
from sim.harness import SimRack, sim_rack

TOKEN = "status-page-admin-token"


class StatusRack:
    def __init__(self, rack: SimRack, agents: dict[str, AgentProcess], configs: dict[str, dict[str, Any]]):
        self.rack, self.agents, self.configs = rack, agents, configs

    def post_alert(self, node: str, labels: dict[str, str], annotations: dict[str, str]) -> int:
        """One firing Alertmanager alert (payload version 4) to a node's webhook; the HTTP status."""
        alert = {"status": "firing", "labels": labels, "annotations": annotations, "startsAt": "2026-12-01T00:00:00Z",
                 "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": "status-page-test"}
        body = {"version": "4", "status": "firing", "receiver": "agent", "groupKey": "k", "truncatedAlerts": 0,
                "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am",
                "alerts": [alert]}
        return self.agents[node].request("POST", "/api/v1/alerts", body=body, token=TOKEN,
                                         headers={"Content-Type": "application/json"})[0]

    def restart(self, node: str) -> AgentProcess:
        """Stop a node's agent and start it again on the same port and state dir."""
        old = self.agents[node]
        old.stop()
        self.agents[node] = AgentProcess(self.configs[node], old.workdir).start()
        return self.agents[node]


@contextmanager
def status_rack(workdir: Path, mode: str = "enforce", prepare: Callable[[SimRack], None] | None = None,
                **sim: Any) -> Iterator[StatusRack]:
    """The rack (2 GB200 nodes x 4 GPUs by default) and its agents, ready (every source polled once);
    `prepare` changes the simulated rack before any agent reads it."""
    sim.setdefault("personality", "gb200")
    with ExitStack() as stack:
        rack = stack.enter_context(sim_rack(workdir, **sim))
        if prepare is not None:
            prepare(rack)
        for name in ("admin.token", "webhook.token"):
            (workdir / name).write_text(TOKEN + "\n")
        ports = {node: free_port() for node in rack.sim.model.nodes}
        urls = {node: f"http://127.0.0.1:{port}" for node, port in ports.items()}
        agents: dict[str, AgentProcess] = {}
        configs: dict[str, dict[str, Any]] = {}
        for node, port in ports.items():
            cfg = agent_config(rack.sim, node, port, workdir, mode=mode, agent_urls=urls)
            cfg["remediation"]["slurm"] = {"backend": "simulated"}
            # R shown within seconds of the load gate opening (shipped: settled 30 s, smoothed over 60 s): the
            # page's cold plate column is what is checked, not the derived source's timing
            cfg["sources"]["thermal_resistance"] = {"settle_seconds": 2.0, "smoothing_seconds": 2.0}
            (workdir / node).mkdir(parents=True, exist_ok=True)
            configs[node] = cfg
            agents[node] = AgentProcess(cfg, workdir / node).start()
            stack.callback(lambda n=node: agents[n].stop())
        for agent in agents.values():
            wait_for(lambda a=agent: a.get("/readyz")[0] == 200, 30, what="every source polled once")
        yield StatusRack(rack, agents, configs)
