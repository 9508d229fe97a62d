"""The jobs of a drill: the reference job's own account (its event log, one JSON object a line,
examples/drill_job.py), and which running jobs a drill may drain (`drill_safe_jobs`).

Why the job's word as well as Slurm's: Slurm knows the job was requeued and runs elsewhere; only the job knows
it caught the signal, wrote its checkpoint and started again from it rather than from the beginning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .plan import DRILL_SAFE, DrillRefused


@dataclass
class JobEvents:
    starts: list[dict[str, Any]] = field(default_factory=list)  # every start of the job, before the drill too
    checkpoint: dict[str, Any] | None = None  # the first checkpoint written on the signal, since the drill began
    resumed: dict[str, Any] | None = None  # the first start after it, from that checkpoint, on another node
    unreadable: str | None = None


def job_events(log: Path, job: str, since: float = 0.0) -> JobEvents:
    """The events of job `job` in `log`, its checkpoint and resume those written at or after `since` (the drill's
    start: a job drilled before carries an earlier drill's checkpoint and resume in its log); a missing file is
    no event yet, a bad line is skipped and said."""
    out = JobEvents()
    try:
        lines = Path(log).read_text().splitlines()
    except FileNotFoundError:
        return out
    except OSError as exc:
        out.unreadable = f"{log}: {exc.strerror}"
        return out
    for n, line in enumerate(lines, 1):
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            out.unreadable = f"{log}: line {n} is not JSON"
            continue
        if not isinstance(ev, dict) or str(ev.get("job")) != job:
            continue
        if ev.get("event") == "start":
            out.starts.append(ev)
            cp = out.checkpoint
            if (cp is not None and out.resumed is None and ev.get("from_checkpoint")
                    and ev.get("step") == cp.get("step") and ev.get("node") != cp.get("node")):
                out.resumed = ev
        elif ev.get("event") == "checkpoint" and out.checkpoint is None:
            ts = ev.get("ts")
            if not isinstance(ts, (int, float)):
                out.unreadable = f"{log}: line {n}: a checkpoint without its time (ts)"
            elif ts >= since:
                out.checkpoint = ev
    return out


async def drill_safe_jobs(scheduler: Any, nodes: list[str], allow_jobs: bool) -> dict[str, str]:
    """job -> node of the running jobs on these nodes (every node of a plan: the conductor's check; its own node:
    each other agent's of the zone); DrillRefused naming a job not marked drill-safe, unless `allow_jobs`."""
    if scheduler is None:
        return {}
    found, foreign = {}, []
    for node in nodes:
        for job in await scheduler.jobs(node):
            comment = await scheduler.job_comment(job) if hasattr(scheduler, "job_comment") else None
            if comment and DRILL_SAFE in comment.split():
                found[job] = node
            else:
                foreign.append(f"{job} on {node}")
    if foreign and not allow_jobs:
        raise DrillRefused(f"nodes: job {', '.join(foreign)} is not marked drill-safe (Slurm comment "
                           f"{DRILL_SAFE!r}): the drill would drain it; pass --allow-jobs to drill anyway")
    return found
