"""The simulated scheduler: an in-process node table for the demo and the tests, where no slurmctld runs.

Why in the simulator: the agent ships without it. A config that says
`remediation.slurm.backend: simulated` gets it through the entry point this
package registers (`supernode_agent.backends`: `scheduler_simulated`).
"""

from __future__ import annotations

from agent.remediation.actions.slurm import NodeState, UnknownNode


class SimulatedScheduler:
    """SIMULATED scheduler (demo without slurmctld): an in-process node table, same interface as SlurmScheduler."""

    label = "simulated"

    def __init__(self, nodes: list[str]):
        self.nodes = {n: NodeState(n, "idle", "") for n in nodes}

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
