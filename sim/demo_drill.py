"""The demo's drill kit: examples/drill-leak.yaml and the reference job, ready to run against the demo rack.

Why a kit and not the example as is: the plan's job log is on storage every node shares (`/shared/drill` in the
example); on the demo's one host that is the demo's own folder. So the demo writes the same plan with its job log
there, and the reference job's script beside it, and prints the two commands of the drill (README, Tour).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "drill-leak.yaml"


def write_drill_kit(workdir: Path) -> tuple[Path, Path]:
    """(the plan, the reference job's script) under `workdir`/drill: examples/drill-leak.yaml with its job log in
    that folder, and examples/drill_job.py logging and checkpointing there."""
    kit = workdir / "drill"
    kit.mkdir(parents=True, exist_ok=True)
    plan = yaml.safe_load(EXAMPLE.read_text())
    plan["job"] = {"log": str(kit / "events.jsonl")}
    plan_path = kit / "drill-leak.yaml"
    plan_path.write_text(f"# {EXAMPLE.relative_to(REPO)}, its job log in the demo's folder\n"
                         + yaml.safe_dump(plan, sort_keys=False))
    job = kit / "job.sh"
    job.write_text("#!/bin/sh\n# the drill's reference job (examples/drill_job.py): checkpoints on SIGUSR1, resumes from it\n"
                   f"exec {shlex.quote(sys.executable)} {shlex.quote(str(REPO / 'examples' / 'drill_job.py'))} "
                   f"--log {shlex.quote(str(kit / 'events.jsonl'))} --checkpoint {shlex.quote(str(kit / 'ckpt.json'))}\n")
    job.chmod(0o755)
    return plan_path, job


def drill_lines(workdir: Path, slurm_conf: Path, node: str) -> str:
    """What the demo prints of the kit: the job's submission and the drill, as an operator runs them."""
    plan, job = write_drill_kit(workdir)
    return (f"drill: SLURM_CONF={slurm_conf} sbatch --comment=drill-safe --requeue --open-mode=append "
            f"-o {job.with_suffix('.out')} {job}\n"
            f"drill: supernode-agent --config {workdir / node / 'agent.yaml'} drill {plan}   "
            f"(examples/drill-leak.yaml; the status page shows its banner and report)")
