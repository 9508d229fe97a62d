"""gpu_reset: the recovery ladder's second rung (issue 33): reset one GPU once it is idle, and prove it worked.

Why each part:
- the wait for no compute process: a reset under a running job kills it, and the driver refuses it anyway
  (`nvidia-smi --gpu-reset` answers "in use"); the playbook drains the node first, so the job ends or is
  requeued, and this step waits (bounded by `gpu_recovery.idle_wait_seconds`) for its processes to go.
  A GPU that never goes idle fails the step, and the ladder escalates;
- the reset is a program (`gpu_recovery.gpu_reset_command`, `nvidia-smi --gpu-reset -i {gpu}` by default:
  NVML has no public reset call), run from an argument list: {gpu}, {node} and {uuid} are replaced inside
  each element, never spliced into a shell, and each value must match exec's strict pattern;
- the verification is the agent's one GPU health read (agent/remediation/gpu_health.py), retried within
  `gpu_recovery.verify_seconds`: a reset that leaves the GPU unhealthy (a reboot-class fault, a failed row
  remap, NVML hung) fails the step, and that failure, recorded in the recovery ledger, is what escalates
  the fault to a reboot.
A reset cannot be undone (undo is a skipped no-op); after a crash mid-reset the health read decides whether
it took effect. Every NVML call runs on NVML's own bounded pool (agent.remediation.calls) with a timeout.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Mapping

from ..gpu_health import check_gpus
from ..settings import GpuRecoverySettings
from . import ActionError, ActionResult, run_program
from .exec import SAFE
from .nvml_gpu import GpuActionBase

PLACEHOLDERS = ("gpu", "node", "uuid")
POLL_SECONDS = 1.0  # how often the idle wait and the verification look again
NVML_ERROR_GPU_IS_LOST = 15  # pynvml.NVML_ERROR_GPU_IS_LOST


def reset_argv(template: list[str], values: Mapping[str, str]) -> list[str]:
    """The reset's argument list: each {gpu}/{node}/{uuid} replaced inside its own element.

    Why not str.format: a template element may carry other braces (a JSON argument); why the pattern check:
    a value is one argument, and one that could read as options or paths of its own is refused.
    """
    for name in PLACEHOLDERS:
        if any(f"{{{name}}}" in arg for arg in template) and not SAFE.match(str(values.get(name, ""))):
            raise ActionError(f"gpu_reset: value of {{{name}}} missing or unsafe: {values.get(name)!r}",
                              guardrail="exec_args")
    out = []
    for arg in template:
        for name in PLACEHOLDERS:
            arg = arg.replace(f"{{{name}}}", str(values.get(name, "")))
        out.append(arg)
    return out


def _uuid_and_pids(lib: Any, index: int) -> tuple[str, list[int]]:
    h = lib.nvmlDeviceGetHandleByIndex(index)
    return str(lib.nvmlDeviceGetUUID(h)), _pids_of(lib, h)


def _pids_of(lib: Any, h: Any) -> list[int]:
    return sorted(int(p.pid) for p in lib.nvmlDeviceGetComputeRunningProcesses(h))


def _pids(lib: Any, index: int) -> list[int]:
    return _pids_of(lib, lib.nvmlDeviceGetHandleByIndex(index))


def _check_one(lib: Any, index: int) -> tuple[bool, str]:
    return check_gpus(lib, 0, [index])


def _last_line(*texts: str) -> str:
    """The program's own last word (stderr first): what a person reads in the journal."""
    for text in texts:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if lines:
            return lines[-1][:300]
    return ""


class GpuResetAction(GpuActionBase):
    kind = "gpu_reset"

    def __init__(self, libs: Mapping[str, Any], settings: GpuRecoverySettings, call_timeout: float = 5.0,
                 command: list[str] | None = None):
        self.libs = dict(libs)
        self.settings = settings
        self.command = list(command or settings.gpu_reset_command)
        self.timeout = call_timeout

    def _nvml_error(self, index: int, exc: Exception, what: str) -> ActionError:
        lost = getattr(exc, "value", None) == NVML_ERROR_GPU_IS_LOST
        return ActionError(f"GPU {index} {what}: {type(exc).__name__}: {exc}"
                           + ("; off the bus, a reset cannot reach it (a reboot may)" if lost else ""),
                           permanent=lost)

    async def plan(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict:
        """The GPU's uuid, its compute processes now, and the argv the reset will run; recorded in the intent."""
        node, lib, index = target["node"], self._lib(target["node"]), int(target["gpu"])
        try:
            uuid, pids = await self._call(_uuid_and_pids, lib, index)
        except Exception as exc:  # NVMLError, DeviceCallTimeout
            raise self._nvml_error(index, exc, "does not answer NVML") from None
        argv = reset_argv(self.command, {"gpu": str(index), "node": node, "uuid": uuid})
        # owned False: a reset leaves nothing of ours to take back, so the engine holds no effect for undo
        return {"before": {"owned": False, "processes": pids}, "uuid": uuid, "argv": argv}

    async def _wait_idle(self, lib: Any, index: int) -> list[int]:
        """Poll until the GPU has no compute process; the pids seen while waiting (empty: idle at once)."""
        deadline = time.monotonic() + self.settings.idle_wait_seconds
        seen: set[int] = set()
        while True:
            try:
                pids = await self._call(_pids, lib, index)
            except Exception as exc:
                raise self._nvml_error(index, exc, "processes unreadable while waiting for it to be idle") from None
            if not pids:
                return sorted(seen)
            seen.update(pids)
            if time.monotonic() >= deadline:
                # permanent: a retry would wait the whole window again; the ladder escalates instead
                raise ActionError(f"GPU {index} not idle after {self.settings.idle_wait_seconds:g} s: "
                                  f"{len(pids)} compute process(es) remain (pid {', '.join(map(str, pids))})",
                                  permanent=True)
            await asyncio.sleep(POLL_SECONDS)

    async def _health(self, lib: Any, index: int) -> tuple[bool, str]:
        """The shared health read of this one GPU; a hung or failing NVML reads as not healthy, with why."""
        try:
            return await self._call(_check_one, lib, index)
        except Exception as exc:  # DeviceCallTimeout, NVMLError from the count
            return False, f"NVML health read failed: {type(exc).__name__}: {exc}"

    async def _verify(self, lib: Any, index: int) -> str:
        """Healthy within verify_seconds (the driver may take a moment to settle after a reset), or the reason."""
        deadline = time.monotonic() + self.settings.verify_seconds
        while True:
            ok, why = await self._health(lib, index)
            if ok:
                return why
            if time.monotonic() >= deadline:
                # permanent: another reset of a GPU a reset did not fix is time lost; the ladder reboots next
                raise ActionError(f"reset did not clear the fault: {why}", permanent=True)
            await asyncio.sleep(POLL_SECONDS)

    async def apply(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any],
                    plan: Mapping[str, Any]) -> ActionResult:
        lib, index = self._lib(target["node"]), int(target["gpu"])
        argv = list(plan["argv"])
        waited = await self._wait_idle(lib, index)
        try:
            rc, out, err = await run_program(argv, self.settings.gpu_reset_timeout_seconds)
        except TimeoutError:
            raise ActionError(f"reset: {argv[0]} did not finish within "
                              f"{self.settings.gpu_reset_timeout_seconds:g} s (killed)") from None
        except OSError as exc:  # not installed, not executable: a configuration fault, not worth a retry
            raise ActionError(f"reset: cannot run {argv[0]}: {exc}", permanent=True) from None
        if rc != 0:
            raise ActionError(f"reset: {argv[0]} exit {rc}: {_last_line(err, out) or 'no output'}")
        verified = await self._verify(lib, index)
        return ActionResult(True, f"gpu {index} reset and verified healthy", before=dict(plan["before"]),
                            after={"uuid": plan["uuid"], "command": argv, "output": _last_line(out, err),
                                   "processes_waited_for": waited, "verify": verified})

    async def undo(self, target: Mapping[str, str], before: Mapping[str, Any], after: Mapping[str, Any],
                   params: Mapping[str, Any]) -> ActionResult:
        return ActionResult(True, "a GPU reset cannot be undone", skipped=True)

    async def reconcile(self, target: Mapping[str, str], params: Mapping[str, Any], plan: Mapping[str, Any]) -> str:
        """After a crash mid-reset: the GPU healthy now means the reset (or whatever came since) took effect."""
        try:
            lib, index = self._lib(target["node"]), int(target["gpu"])
            ok, _ = await self._call(_check_one, lib, index)
        except Exception:
            return "unknown"
        return "applied" if ok else "not_applied"
