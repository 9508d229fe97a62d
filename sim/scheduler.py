"""The simulated scheduler: an in-process node table for the demo and the tests, where no slurmctld runs.

Why in the simulator: the agent ships without it. A config that says
`remediation.slurm.backend: simulated` gets it through the entry point this
package registers (`supernode_agent.backends`: `scheduler_simulated`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from agent.httpclient import request_json
from agent.remediation.actions.slurm import NodeState, SchedulerError, UnknownNode


class SimulatedScheduler:
    """SIMULATED scheduler (demo without slurmctld): an in-process node table, same interface as SlurmScheduler."""

    label = "simulated"

    def __init__(self, nodes: list[str], simulator_url: Callable[[], str] | None = None,
                 clock: Callable[[], float] = time.time):
        self.nodes = {n: NodeState(n, "idle", "") for n in nodes}
        self.clock = clock
        self.booted = {n: clock() for n in nodes}
        self.job_table: dict[str, dict[str, str]] = {}  # job id -> {"node", "comment"}: empty unless added
        self.requeued: list[str] = []
        self.simulator_url = simulator_url or _running_simulator

    def add_job(self, job: str, node: str) -> None:
        """A running job on `node` (the demo or a test puts one there: the simulator runs no workload manager)."""
        self.job_table[job] = {"node": node, "comment": ""}

    async def list(self, nodes: list[str] | None = None) -> dict[str, NodeState]:
        return {n: st for n, st in self.nodes.items() if not nodes or n in nodes}

    async def state(self, node: str) -> NodeState:
        try:
            return self.nodes[node]
        except KeyError:
            raise UnknownNode(f"node {node} unknown to the simulated scheduler") from None

    async def drain(self, node: str, reason: str) -> None:
        await self.state(node)
        self.nodes[node] = NodeState(node, "drained", reason)

    async def resume(self, node: str) -> None:
        await self.state(node)
        self.nodes[node] = NodeState(node, "idle", "")

    async def signal_jobs(self, node: str, signal: str) -> None:
        return None

    async def jobs(self, node: str) -> list[str]:
        await self.state(node)
        return [j for j, info in self.job_table.items() if info["node"] == node]

    def _job(self, job: str) -> dict[str, str]:
        try:
            return self.job_table[job]
        except KeyError:
            raise SchedulerError(f"job {job} unknown to the simulated scheduler") from None

    async def comment_job(self, job: str, text: str) -> None:
        self._job(job)["comment"] = text

    async def job_comment(self, job: str) -> str | None:
        info = self.job_table.get(job)
        return None if info is None else info["comment"]

    async def requeue_job(self, job: str) -> None:
        self._job(job)
        del self.job_table[job]
        self.requeued.append(job)

    async def reboot(self, node: str, reason: str) -> None:
        """The simulator's twin reboots the node (new boot id, its faults cleared); then the node is back idle
        with a new boot time. Without a simulator to tell, nothing is pretended: SchedulerError says why."""
        await self.state(node)
        try:
            url = self.simulator_url()
        except LookupError as exc:
            raise SchedulerError(f"cannot reboot {node}: {exc}") from None
        try:
            status, body = await asyncio.to_thread(request_json, "POST", f"{url}/api/v1/inject",
                                                   {"kind": "reboot", "params": {"node": node}})
        except OSError as exc:
            raise SchedulerError(f"cannot reboot {node}: simulator at {url} does not answer: {exc}") from None
        if status >= 300:
            raise SchedulerError(f"cannot reboot {node}: simulator answered {status}: {body}")
        self.booted[node] = self.clock()
        self.nodes[node] = NodeState(node, "idle", "")

    async def boot_time(self, node: str) -> float | None:
        await self.state(node)
        return self.booted[node]


def _running_simulator() -> str:
    from sim.server import find_simulator

    return find_simulator()
