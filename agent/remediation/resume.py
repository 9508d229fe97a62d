"""Resume policy: a node drained for a GPU fault returns to service only when a health check passes.

Why: an XID, a lost GPU or a dead NVLink "clears" when its series goes
quiet, not when the GPU is fixed; resuming on that timer sends jobs back to
a broken node. So the undo of such a drain (playbook steps marked
`resume_check: true`) first runs the configured check:

- `nvml` (default): the agent asks NVML itself: every inventory GPU visible
  and answering, NVML's recovery action NONE on each, and no GPU fault the
  judge (gpu_faults.py) still holds outstanding on the node;
- the name of an `exec_allow` program (e.g. `dcgmi diag -r 1` in a wrapper):
  exit 0 passes; it gets the node name as its only argument;
- `none`: no check; a person always decides.

When the check does not pass (or cannot run: no NVML for that node on this
agent), the resume waits for a person's approval (`resume_after_check`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping

from .actions import run_program
from .gpu_health import check_gpus

CALL_TIMEOUT = 5.0


class ResumeCheck:
    def __init__(self, check: str, gpu_libs: Mapping[str, Any], expected_gpus: int, exec_allow: Mapping[str, Any],
                 xid_active: Callable[[str], bool]):
        self.check = check
        self.gpu_libs = gpu_libs
        self.expected = expected_gpus
        self.exec_allow = exec_allow
        self.xid_active = xid_active

    async def gpus_healthy(self, node: str, indices: list[int] | None = None) -> tuple[bool, str]:
        """The NVML health read alone (no XID hold): what a reset or a reboot is verified with."""
        lib = self.gpu_libs.get(node)
        if lib is None:
            return False, f"no NVML for {node} on this agent: cannot check its GPUs"
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                return await asyncio.to_thread(check_gpus, lib, self.expected, indices)
        except asyncio.TimeoutError:
            return False, f"NVML did not answer within {CALL_TIMEOUT:g} s"
        except Exception as exc:
            return False, f"NVML check failed: {exc}"

    async def run(self, node: str) -> tuple[bool, str]:
        """(passed, why in words) for resuming `node`."""
        if self.check == "none":
            return False, "no resume health check configured (remediation.resume_health_check: none)"
        if self.check == "nvml":
            lib = self.gpu_libs.get(node)
            if lib is None:
                return False, f"no NVML for {node} on this agent: cannot check its GPUs"
            if self.xid_active(node):
                return False, f"a GPU fault on {node} is outstanding (no recovery has proven it cleared)"
            try:
                async with asyncio.timeout(CALL_TIMEOUT):
                    return await asyncio.to_thread(check_gpus, lib, self.expected)
            except asyncio.TimeoutError:
                return False, f"NVML did not answer within {CALL_TIMEOUT:g} s"
            except Exception as exc:
                return False, f"NVML check failed: {exc}"
        prog = self.exec_allow[self.check]
        try:
            rc, out, err = await run_program([str(prog.path), node], prog.timeout_seconds)
        except (TimeoutError, OSError) as exc:
            return False, f"{self.check}: {exc}"
        tail = (err.strip() or out.strip()).splitlines()[-1:] or [""]
        return rc == 0, f"{self.check} exited {rc}" + (f": {tail[0][:200]}" if tail[0] else "")
