#!/usr/bin/env python3
"""The drill's reference job: counts steps, checkpoints on the agent's signal (SIGUSR1), resumes from it.

Submit it marked drill-safe (the drill refuses a node running any job that is not), requeueable, with its
output appended across restarts:

    sbatch --comment=drill-safe --requeue --open-mode=append -o drill-job.out \\
        examples/drill_job.py --log /shared/drill/events.jsonl --checkpoint /shared/drill/ckpt.json

It writes one JSON line per event to `--log` (start, with the step it starts from and whether that came from
a checkpoint; checkpoint, with the step and the signal), which the agent reads to confirm the signal arrived
and the job resumed from its checkpoint on another node. Both paths must be on storage every node shares.
"""

from __future__ import annotations

import signal
import threading

# The signal may come as soon as Slurm starts the job: catch it before anything slow happens
# (SIGUSR1's default action would kill the job without its checkpoint).
SIGNALLED = threading.Event()
signal.signal(signal.SIGUSR1, lambda signum, frame: SIGNALLED.set())

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402


def event(log: Path, **fields: object) -> None:
    line = json.dumps({"ts": time.time(), "job": os.environ.get("SLURM_JOB_ID", ""),
                       "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()), **fields})
    with log.open("a") as f:  # one write of one line: readers never see half an event
        f.write(line + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log", type=Path, required=True, help="event log (JSON lines), on shared storage")
    p.add_argument("--checkpoint", type=Path, required=True, help="checkpoint file, on shared storage")
    p.add_argument("--step-seconds", type=float, default=0.1)
    p.add_argument("--steps", type=int, default=100000, help="steps to the end of the job")
    args = p.parse_args(argv)
    try:
        step = int(json.loads(args.checkpoint.read_text())["step"])
        resumed = True
    except (FileNotFoundError, ValueError, KeyError):
        step, resumed = 0, False
    event(args.log, event="start", step=step, from_checkpoint=resumed)
    while step < args.steps:
        if SIGNALLED.is_set():
            SIGNALLED.clear()
            tmp = args.checkpoint.with_suffix(".tmp")
            tmp.write_text(json.dumps({"step": step}))
            tmp.replace(args.checkpoint)  # atomic: a requeue mid-write never leaves half a checkpoint
            event(args.log, event="checkpoint", step=step, signal="USR1")
        time.sleep(args.step_seconds)
        step += 1
    event(args.log, event="done", step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
