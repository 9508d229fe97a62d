"""The scheduler adapter: the real Slurm (scontrol/sinfo).

It offers drain / resume / state / list / signal_jobs, and for the GPU recovery
ladder jobs / comment_job / requeue_job / reboot / boot_time (the simulator's
SimulatedScheduler, sim/scheduler.py, offers the same). The Slurm one passes
SLURM_CONF through the environment of every call and uses argument lists
only (no shell); the reason is one argv element, so no quoting games.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from . import run_program

DRAINED_WORDS = ("drain", "down", "fail")
NO_BOOT_TIME = ("None", "Unknown", "")
COMMENT = re.compile(r"(?:^|\s)Comment=(.*?)\s*(?=\s[A-Za-z:/]+=|$)")


@dataclass(frozen=True, slots=True)
class NodeState:
    node: str
    state: str  # sinfo %T: idle, allocated, draining, drained, down*, idle*...
    reason: str

    @property
    def drained(self) -> bool:
        return any(w in self.state for w in DRAINED_WORDS)


class SchedulerError(Exception):
    pass


class UnknownNode(SchedulerError):
    """The scheduler answered, and does not know the node: not a reason to retry."""


class SlurmScheduler:
    """Talks to slurmctld with Slurm's own clients."""

    label = "slurm"

    def __init__(self, scontrol: str = "scontrol", sinfo: str = "sinfo", slurm_conf: Path | str | None = None,
                 timeout: float = 10.0, scancel: str = "scancel", squeue: str = "squeue"):
        self.scontrol = scontrol
        self.sinfo = sinfo
        self.scancel = scancel
        self.squeue = squeue
        self.timeout = timeout
        self.env = dict(os.environ)
        if slurm_conf:
            self.env["SLURM_CONF"] = str(slurm_conf)

    async def _run(self, *args: str) -> str:
        try:
            rc, out, err = await run_program(list(args), self.timeout, self.env)
        except TimeoutError as exc:
            raise SchedulerError(str(exc)) from None
        if rc != 0:
            raise SchedulerError(f"{' '.join(args[:3])}: exit {rc}: {err.strip()}")
        return out

    async def list(self, nodes: list[str] | None = None) -> dict[str, NodeState]:
        """Node states; `nodes` limits the answer to those (`sinfo -n`): a rack counts only its own nodes."""
        args = [self.sinfo, "-h", "-N"] + (["-n", ",".join(nodes)] if nodes else []) + ["-o", "%N|%T|%E"]
        out = await self._run(*args)
        states: dict[str, NodeState] = {}
        for line in out.splitlines():
            parts = line.split("|", 2)
            if len(parts) == 3:
                reason = "" if parts[2] == "none" else parts[2]
                states[parts[0]] = NodeState(parts[0], parts[1], reason)
        return {n: st for n, st in states.items() if not nodes or n in nodes}

    async def state(self, node: str) -> NodeState:
        out = await self._run(self.sinfo, "-h", "-N", "-n", node, "-o", "%N|%T|%E")
        for line in out.splitlines():
            parts = line.split("|", 2)
            if len(parts) == 3 and parts[0] == node:
                return NodeState(node, parts[1], "" if parts[2] == "none" else parts[2])
        raise UnknownNode(f"node {node} unknown to Slurm")

    async def drain(self, node: str, reason: str) -> None:
        await self._run(self.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    async def resume(self, node: str) -> None:
        await self._run(self.scontrol, "update", f"NodeName={node}", "State=RESUME")

    async def signal_jobs(self, node: str, signal: str) -> None:
        """Signal every job on the node: its batch shell and every step (`--full`), where a job checkpoints.

        Each job is tried even if another fails; the failures are raised together afterwards.
        """
        out = await self._run(self.squeue, "-h", "-w", node, "-o", "%i")
        errors = []
        for job in out.split():
            try:
                await self._run(self.scancel, f"--signal={signal}", "--full", job)
            except SchedulerError as exc:
                errors.append(f"job {job}: {exc}")
        if errors:
            raise SchedulerError("; ".join(errors))


    async def jobs(self, node: str) -> list[str]:
        """Ids of the jobs running on the node (pending ones have no GPU of it to be told about)."""
        out = await self._run(self.squeue, "-h", "-w", node, "-t", "RUNNING", "-o", "%i")
        return out.split()

    async def comment_job(self, job: str, text: str) -> None:
        await self._run(self.scontrol, "update", f"JobId={job}", f"Comment={text}")

    async def _show_job(self, job: str) -> str | None:
        """`scontrol show job -o J`; None once Slurm no longer knows the job."""
        try:
            return await self._run(self.scontrol, "show", "job", "-o", job)
        except SchedulerError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise

    async def job_comment(self, job: str) -> str | None:
        """The job's Comment as `scontrol show job -o` shows it; None once Slurm no longer knows the job."""
        out = await self._show_job(job)
        if out is None:
            return None
        m = COMMENT.search(out.strip())
        return None if m is None or m.group(1) == "(null)" else m.group(1)

    async def requeue_job(self, job: str) -> None:
        await self._run(self.scontrol, "requeue", job)

    async def job_fields(self, job: str, *keys: str) -> dict[str, str] | None:
        """Some fields of `scontrol show job -o` (JobState, NodeList, Restarts...); None once Slurm forgot it."""
        out = await self._show_job(job)
        if out is None:
            return None
        return {k: m.group(1) for k in keys if (m := re.search(rf"(?:^|\s){k}=(\S*)", out))}

    async def reboot(self, node: str, reason: str) -> None:
        """Slurm's own reboot: it drains the node, reboots it through RebootProgram once idle, resumes it after."""
        await self._run(self.scontrol, "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", node)

    async def boot_time(self, node: str) -> float | None:
        """BootTime of `scontrol show node -o` (slurmctld's local time) as epoch seconds; None if it shows none."""
        try:
            out = await self._run(self.scontrol, "show", "node", "-o", node)
        except SchedulerError as exc:
            if "not found" in str(exc):
                raise UnknownNode(f"node {node} unknown to Slurm") from None
            raise
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        if fields.get("NodeName") != node:
            raise SchedulerError(f"scontrol show node {node}: answer without NodeName={node}")
        text = fields.get("BootTime", "")
        if text in NO_BOOT_TIME:
            return None
        try:
            return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
        except ValueError:
            raise SchedulerError(f"scontrol show node {node}: BootTime {text!r} is not a time") from None
