"""What every action on one GPU shares: its node's NVML library, and calls on NVML's own bounded pool.

Why one place: the power cap and the reset must refuse a node whose GPUs this agent does not read the same
way, and call NVML the same way (agent.remediation.calls: a hung GPU fails the step, never holds it).
"""

from __future__ import annotations

from typing import Any, Callable

from ..calls import NVML
from . import ActionError


class GpuActionBase:
    """`libs` maps node -> an object with pynvml's function names (real pynvml or the simulator's NVML twin)."""

    libs: dict[str, Any]
    timeout: float

    def _lib(self, node: str) -> Any:
        lib = self.libs.get(node)
        if lib is None:
            raise ActionError(f"no NVML handle for node {node} (not this agent's node)", permanent=True)
        return lib

    async def _call(self, fn: Callable[..., Any], lib: Any, index: int, *args: Any) -> Any:
        """On NVML's own bounded pool with a timeout: a hung GPU fails the step, never holds it, and while
        its earlier call is still stuck it is refused at once (one hung GPU holds one thread)."""
        return await NVML(fn, lib, index, *args, timeout=self.timeout, key=(id(lib), index))
