"""The demo's stand-in for a training job: one per node of the demo's Slurm, keeping that node's GPUs busy.

Why: the recovery ladder waits for a GPU to be idle before it resets it, and Slurm's `reboot ASAP` waits for a
node's jobs to end, so the demo needs jobs that behave like real ones. While this job runs, its node's GPUs in
the simulator draw the workload a job would (and show a process each); on the agent's checkpoint signal
(SIGUSR1, sent before a drain or a reboot), or when Slurm ends it, it checkpoints and exits, and the GPUs go
idle, as when a real job leaves its GPUs.

    python -m sim.demo_job --sim URL --node node01 [--ratio 0.85]
"""

from __future__ import annotations

import signal
import threading

# The checkpoint signal may come as soon as Slurm starts the job: catch it before anything slow is imported
# (SIGUSR1's default action would kill the job before it could leave its GPUs idle).
DONE = threading.Event()
for _sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
    signal.signal(_sig, lambda signum, frame: DONE.set())

import argparse  # noqa: E402
import sys  # noqa: E402

from agent.httpclient import request_json  # noqa: E402


def _workload(sim: str, node: str, ratio: float) -> None:
    status, body = request_json("POST", f"{sim}/api/v1/inject",
                                {"kind": "workload", "params": {"node": node, "ratio": str(ratio)}})
    if status != 200:
        raise SystemExit(f"demo job: the simulator refused workload {ratio} on {node}: {status} {body}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.demo_job", description="a demo job on one simulated node")
    p.add_argument("--sim", required=True, help="simulator URL")
    p.add_argument("--node", required=True)
    p.add_argument("--ratio", type=float, default=0.85, help="GPU workload while the job runs (0..1)")
    args = p.parse_args(argv)
    done = DONE
    _workload(args.sim, args.node, args.ratio)
    print(f"demo job on {args.node}: GPUs at workload {args.ratio}", flush=True)
    try:
        done.wait()
    finally:
        _workload(args.sim, args.node, 0.0)
        print(f"demo job on {args.node}: checkpointed, GPUs idle", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
