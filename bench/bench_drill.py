"""The fault drill's stage timings in the demo (issue 36): examples/drill-leak.yaml, run as an operator runs it.

The demo's rack, Slurm and agent configuration (sim.demo: the simulated rack behind its real protocols, a private
two-node slurmctld with the demo's cred_expire of 10 s, the agent in enforce mode with a 5 s dry hold), one agent
on each node, and the reference job (examples/drill_job.py, submitted as README says). RUNS drills (default 5;
BENCH_RUNS), each of the leak plan of examples/drill-leak.yaml (its targets, its real actions) for the zone whose
node runs the job now, through `supernode-agent drill`: the job goes node01 -> node02 -> node01 ... Printed: the
median (and the slowest) of each stage's time from injection in the drill's own report, and the peer in the same
run: Slurm's part of `job_resumed` (from the drill's `scontrol requeue` to the job's start from its checkpoint on
the other node: the credential hold of a requeued batch job and the scheduling pass), as a ratio to the agent's
part (injection -> requeued).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import yaml  # noqa: E402

from sim.demo import agent_config  # noqa: E402
from sim.demo_drill import write_drill_kit  # noqa: E402
from sim.harness import sim_rack  # noqa: E402
from sim.slurm_cluster import SlurmCluster, slurm_available  # noqa: E402
from tests.agentproc import running_agent  # noqa: E402
from tests.helpers import free_port  # noqa: E402
from timing import machine_reference, until  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "5"))
REPO = Path(__file__).resolve().parent.parent


def job_node(cluster: SlurmCluster, job: str) -> str | None:
    q = subprocess.run(["squeue", "-h", "-j", job, "-t", "RUNNING", "-o", "%N"], env=cluster.env,
                       capture_output=True, text=True, timeout=20)
    return q.stdout.strip() or None


def main() -> int:
    if not slurm_available():
        print("no Slurm here: the drill's job stages need slurmctld")
        return 1
    work = Path(tempfile.mkdtemp(prefix="bench-drill-"))
    for node in ("node01", "node02"):
        (work / node).mkdir()
    (work / "admin.token").write_text("bench-drill-token\n")
    (work / "webhook.token").write_text("bench-drill-token\n")
    plan_path, job_script = write_drill_kit(work)
    plan = yaml.safe_load(plan_path.read_text())
    cluster = SlurmCluster(names=["node01", "node02"], base=work / "slurm").start()
    reports: list[dict] = []
    try:
        with sim_rack(work / "rack") as rack:
            agents = {}
            with running_agent(_config(rack, cluster, "node01", work), work / "node01") as a1, \
                    running_agent(_config(rack, cluster, "node02", work), work / "node02") as a2:
                agents = {"node01": a1, "node02": a2}
                sub = subprocess.run(["sbatch", "--comment=drill-safe", "--requeue", "--open-mode=append", "-o",
                                      str(job_script.with_suffix(".out")), str(job_script)], env=cluster.env,
                                     capture_output=True, text=True, timeout=20, check=True)
                job = sub.stdout.split()[-1]
                for run in range(RUNS):
                    node = until(lambda: job_node(cluster, job), 300, "the reference job running", step=0.2)
                    zone = next(z["name"] for z in agents[node].config["inventory"]["leak_zones"] if node in z["nodes"])
                    run_plan = work / f"plan-{run}.yaml"
                    run_plan.write_text(yaml.safe_dump({**plan, "name": f"bench-{run}", "nodes": [node],
                                                        "scenario": {"kind": "leak", "zone": zone}}))
                    out = subprocess.run([sys.executable, "-m", "agent.cli", "--config", str(agents[node].config_path),
                                          "drill", str(run_plan), "--format", "json", "--wait", "900"],
                                         capture_output=True, text=True, timeout=1000, cwd=REPO)
                    rep = json.loads(out.stdout)["report"]
                    reports.append(rep)
                    print(f"drill {run + 1}/{RUNS} on {node}: {rep['state']} "
                          + " ".join(f"{s['stage']}={s['seconds']}" for s in rep["stages"]), flush=True)
                subprocess.run(["scancel", job], env=cluster.env, capture_output=True, timeout=20)
    finally:
        cluster.cleanup()
    _summary(reports)
    return 0 if all(r["passed"] for r in reports) else 1


def _config(rack, cluster: SlurmCluster, node: str, work: Path) -> dict:
    cfg = agent_config(rack.sim, node, free_port(), work, slurm_conf=cluster.conf)
    cfg["remediation"]["slurm"]["checkpoint_signal"] = "USR1"  # as the demo sets it
    return cfg


def _summary(reports: list[dict]) -> None:
    stages = [s["stage"] for s in reports[0]["stages"]] if reports else []
    print(f"\nfault drill in the demo (examples/drill-leak.yaml), {len(reports)} drills, "
          f"{sum(r['passed'] for r in reports)} passed; seconds from injection, median (slowest):")
    for stage in stages:
        values = [s["seconds"] for r in reports for s in r["stages"] if s["stage"] == stage and s["seconds"] is not None]
        if values:
            print(f"  {stage:<17} {statistics.median(values):7.2f} s  ({max(values):.2f} s)")
    by = {st: [next(s["seconds"] for s in r["stages"] if s["stage"] == st) for r in reports]
          for st in ("job_requeued", "job_resumed")}
    agent = [a for a in by["job_requeued"] if a is not None]
    slurm = [b - a for a, b in zip(by["job_requeued"], by["job_resumed"]) if a is not None and b is not None]
    if agent and slurm:
        ms, ma = statistics.median(slurm), statistics.median(agent)
        print(f"  peer: Slurm's requeue -> start from checkpoint elsewhere {ms:.2f} s, the agent's injection -> "
              f"requeued {ma:.2f} s: {ms / ma:.1f}x")
    print(f"  load average {os.getloadavg()[0]:.1f} at the end; {machine_reference()}")
    print(f"  {time.strftime('%Y-%m-%d')}")


if __name__ == "__main__":
    sys.exit(main())
