"""Leak response under the engine's own faults: leak bit flipped in the simulator -> node drained in a real
slurmctld, and -> first GPU power cap applied, p50/p99, three cases in one run:

  healthy           the rack as simulated;
  one GPU hung      every NVML call on node01's GPU 1 blocks 3 s (the twin's per-GPU hang), the agent's
                    device budget is 1 s;
  state disk full   the agent's state_dir is a 2 MiB tmpfs, filled to ENOSPC before the injections
                    (needs root), so no journal row reaches the disk during the run.

A real agent process polls the simulated CDU's leak bit every POLL s; the times are the agent's own
result rows (the drain's result is written after sinfo read the node back as draining/drained; the
cap's after NVML read the limit back), read through /api/v1/journal, which includes the rows still
waiting in memory. Aim: drain p99 < leak poll + 100 ms in all three cases.
RUNS injections per case (default 30; BENCH_RUNS overrides it).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from sim.demo import agent_config  # noqa: E402
from sim.slurm_cluster import SlurmCluster  # noqa: E402
from tests.agentproc import running_agent  # noqa: E402
from tests.helpers import fill_filesystem, free_port  # noqa: E402
from sim.harness import sim_rack  # noqa: E402
from timing import percentiles, until  # noqa: E402

POLL = 0.5
RUNS = int(os.environ.get("BENCH_RUNS", "30"))
TOKEN = "bench-token"


def run_case(case: str, work: Path, cluster: SlurmCluster) -> tuple[list[float], list[float]]:
    drain_lat, cap_lat = [], []
    with sim_rack(work / case) as rack:
        for name in ("admin.token", "webhook.token"):
            (work / case / name).write_text(TOKEN + "\n")
        cfg = agent_config(rack.sim, "node01", free_port(), work / case, mode="enforce", slurm_conf=cluster.conf)
        cfg["sources"]["leak"] = {"interval": POLL, "timeout": 0.4}
        cfg["remediation"].update({
            "device_timeout_seconds": 1.0,
            # A GPU that stays hung is also a gpu_lost incident that drains the node; off here, so every
            # injection measures the leak's own drain (the hung GPU's effect on the leak path is the question).
            "detectors": {"leak": {"clear_seconds": 0.2}, "leak_tray": {"clear_seconds": 0.2},
                          "gpu_lost": {"enabled": False}},
            "leak_scope": {"dry_hold_seconds": 0},  # each run's undo at once: the bench times the leak's first action
            "guardrails": {"automatic": ["resume_after_leak", "resume_after_check", "cdu_write_valve"], "cooldown_seconds": 0,
                           "max_drained_fraction": 1.0, "max_drained_nodes": 2, "breaker_max_actions": 100000,
                           "rate_per_hour": {"default": 100000}}})
        state = Path(cfg["agent"]["state_dir"])
        if case == "state disk full":
            state.mkdir(parents=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(state)], check=True)
        try:
            with running_agent(cfg, work / case) as agent:
                until(lambda: 'supernode_source_up{device="leak1",source="leak"} 1.0' in agent.metrics(), 30,
                      "leak source up")
                if case == "one GPU hung":
                    rack.inject("gpu-hang", node="node01", gpu=1, seconds=3)
                if case == "state disk full":
                    fill_filesystem(state)

                def rows_since(t: float) -> list[dict]:
                    status, body = agent.get("/api/v1/journal?limit=300", token=TOKEN)
                    return [e for e in json.loads(body)["entries"] if e["ts"] >= t] if status == 200 else []

                for _ in range(RUNS):
                    time.sleep(random.uniform(0, POLL))  # a random phase against the leak poll timer
                    t_flip = time.time()
                    rack.inject("leak", zone="zone-a")

                    def done(action: str):
                        return [e["ts"] for e in rows_since(t_flip) if e["kind"] == "result"
                                and e["action"] == action and e["result"] == "done"]
                    drain_lat.append(until(lambda: done("drain"), 20, "drained")[0] - t_flip)
                    cap_lat.append(min(until(lambda: done("gpu_power_cap"), 20, "first cap")) - t_flip)
                    rack.clear()
                    if case == "one GPU hung":
                        rack.inject("gpu-hang", node="node01", gpu=1, seconds=3)

                    def settled() -> bool:
                        status, body = agent.get("/api/v1/incidents", token=TOKEN)
                        inc = json.loads(body)
                        return (not inc["open"] and not inc["pending_approvals"]
                                and cluster.states().get("node01") == "idle")
                    try:
                        until(settled, 60, "leak resolved, node01 resumed")
                    except TimeoutError:
                        status, body = agent.get("/api/v1/incidents", token=TOKEN)
                        raise TimeoutError(f"{case}: leak not resolved or node01 not resumed: "
                                           f"{cluster.states()} {body[:3000]!r}") from None
                if case == "state disk full":
                    text = agent.metrics()
                    assert "supernode_journal_writable 0.0" in text, "the disk was not full after all"
        finally:
            if case == "state disk full":
                subprocess.run(["umount", "-l", str(state)], check=False)
    return drain_lat, cap_lat


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        cluster = SlurmCluster(names=["node01", "node02"], base=work / "slurm").start()
        try:
            figures = {case: run_case(case, work, cluster) for case in ("healthy", "one GPU hung", "state disk full")}
        finally:
            cluster.cleanup()
    print(f"leak bit flip -> node drained in slurmctld / first GPU cap applied, {RUNS} injections per case "
          f"(Modbus leak poll {POLL}s, random phase):")
    for case, (drain, cap) in figures.items():
        d50, d99 = percentiles(drain)
        c50, c99 = percentiles(cap)
        ok = "met" if d99 < POLL + 0.1 else "NOT met"
        print(f"  {case:16s} drained p50 {d50 * 1000:6.1f} ms  p99 {d99 * 1000:6.1f} ms ({ok}: < poll + 100 ms)"
              f"   first cap p50 {c50 * 1000:6.1f} ms  p99 {c99 * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
