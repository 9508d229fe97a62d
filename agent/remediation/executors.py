"""What remediation actions act through: the device functions the runtime builds from the inventory.

Why typed here: the engine never imports collectors (agent/remediation/wiring.py hands it these callables), so
this dataclass is the whole contract between the two, and each field's type says what it must be. Device
functions may be blocking or coroutine functions: the actions run them through agent/remediation/calls.py
(`DEVICES`), which puts a blocking one on a bounded pool with a timeout and awaits a coroutine's result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol, Union


class Scheduler(Protocol):
    """The workload manager: Slurm (`SlurmScheduler`), or the simulator's (`scheduler_simulated` entry point).

    Every call raises `SchedulerError` when the scheduler cannot be asked (agent/remediation/blast.py turns
    that into the `scheduler_unreachable` block, retried)."""

    async def list(self, nodes: list[str] | None = None) -> dict[str, Any]: ...

    async def state(self, node: str) -> Any: ...

    async def drain(self, node: str, reason: str) -> None: ...

    async def resume(self, node: str) -> None: ...

    async def signal_jobs(self, node: str, signal: str) -> None: ...

    # The GPU recovery ladder (issue 33): the node's jobs, told or requeued; a reboot through the scheduler.

    async def jobs(self, node: str) -> list[str]:
        """Ids of the jobs running on the node."""
        ...

    async def comment_job(self, job: str, text: str) -> None:
        """Set the job's owner-visible comment (Slurm: scontrol update JobId=J Comment=...)."""
        ...

    async def job_comment(self, job: str) -> str | None:
        """The job's comment read back (reconciling a job_notify); None when the scheduler no longer knows it."""
        ...

    async def requeue_job(self, job: str) -> None:
        """Put the job back in the queue (Slurm: scontrol requeue J)."""
        ...

    async def reboot(self, node: str, reason: str) -> None:
        """Reboot the node when it is idle and resume it after (Slurm: scontrol reboot ASAP nextstate=RESUME)."""
        ...

    async def boot_time(self, node: str) -> float | None:
        """When the node last booted, as the scheduler knows it (Slurm: BootTime); None if it does not say."""
        ...


R = Any
# A device function: called with the target's keys (and a value); blocking or a coroutine function.
DeviceFn = Callable[..., Union[R, Awaitable[R]]]


@dataclass
class Executors:
    """What actions act through; the runtime fills the ones this node has (None: that action is not configured
    here, and its steps are journaled `not_configured`)."""

    scheduler: Scheduler | None = None
    gpu_libs: dict[str, Any] = field(default_factory=dict)  # node -> a pynvml-like library (NVML, or the twin)
    link_isolate: DeviceFn | None = None  # (port, up: bool) -> None: ip link / ibportstate
    link_read: DeviceFn | None = None  # port -> "up" | "down" | other: the port's state read back
    cdu_write: DeviceFn | None = None  # (cdu, point, value) -> value written: a profile control point (fenced)
    cdu_read: DeviceFn | None = None  # (cdu, point) -> value
    pdu_set: DeviceFn | None = None  # (pdu, outlet, on: bool) -> bool (fenced)
    pdu_get: DeviceFn | None = None  # (pdu, outlet) -> bool: the outlet is on
    tray_power_set: DeviceFn | None = None  # (bmc, on: bool) -> None: Redfish ComputerSystem.Reset of a tray
    tray_power_get: DeviceFn | None = None  # bmc -> bool: the tray is powered
    gpu_reset_command: list[str] | None = None  # argv template of a GPU reset ({gpu}, {node}, {uuid}); see settings
