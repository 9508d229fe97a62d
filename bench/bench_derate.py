"""Pump loss -> caps applied on a real agent: the derate by thermal margin against the flat 60 % cap, one run.

  thermal margin   the shipped coolant-degraded playbook: gpu_power_cap mode thermal_margin (the node's plan
                   from the loop's capacity and every GPU's NVML power, temperature and limits, then each
                   GPU's limit).
  flat 60 %        the same playbook with the flat `fraction: 0.6` step it had before (a playbook_dir copy of
                   the shipped playbooks, that step changed): the peer, same rack, same agent config.

One simulated rack (sim.harness), node01's agent as `supernode-sim demo` configures it (Modbus CDU polled every
1 s, the Redfish CDU every 2 s, coolant_flow_low held 2 s as shipped); each injection is `pump-fail --cdu cdu1
--pump 2` at a random phase against the polls, timed from the injection to the moment every GPU of node01 reads
its new limit back in the twin; then the pump runs again and the bench waits until the caps are undone.
RUNS injections per case (default 8; BENCH_RUNS overrides it). Prints p50 and p99 per case and their ratio.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from sim.demo import agent_config  # noqa: E402
from sim.harness import sim_rack  # noqa: E402
from tests.agentproc import running_agent  # noqa: E402
from tests.helpers import free_port  # noqa: E402
from timing import percentiles, until  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "8"))
TOKEN = "bench-token"
CASES = ("thermal margin", "flat 60 %")
SHIPPED = Path(__file__).resolve().parent.parent / "agent" / "playbooks"


def flat_playbooks(work: Path) -> Path:
    """The shipped playbooks with the coolant caps back to the flat 60 % of every GPU's default limit."""
    out = work / "playbooks"
    shutil.copytree(SHIPPED, out)
    for name in ("coolant-degraded.yaml", "coolant-supply-hot.yaml"):
        text = (out / name).read_text()
        text = text.replace("params: {mode: thermal_margin, fallback_fraction: 0.6, max_delta_t_celsius: 10, "
                            "max_return_celsius: 50}", "params: {fraction: 0.6}")
        assert "thermal_margin" not in text.split("steps:")[1], name
        (out / name).write_text(text)
    return out


def config(rack, work: Path, case: str) -> dict:
    for name in ("admin.token", "webhook.token"):
        (work / name).write_text(TOKEN + "\n")
    cfg = agent_config(rack.sim, "node01", free_port(), work, mode="enforce")
    # gpu_thermal off in both cases: at half flow the hotter GPU nears its slowdown temperature before any cap,
    # and that incident's own cap (and its 30 s clear hold) is not what is measured here
    cfg["remediation"]["detectors"] = {"flow_setpoint_settle_seconds": 0,
                                       "coolant_flow_low": {"fire_seconds": 2.0, "clear_seconds": 1.0},
                                       "gpu_thermal": {"enabled": False}}
    cfg["remediation"]["guardrails"] = {"cooldown_seconds": 0, "max_drained_fraction": 1.0,
                                        "breaker_max_actions": 100000, "rate_per_hour": {"default": 100000}}
    if case == "flat 60 %":
        cfg["remediation"]["playbook_dir"] = str(flat_playbooks(work))
    return cfg


def limits(rack) -> list[int]:
    with rack.sim.model.lock:
        return [g.power_limit_mw for g in rack.sim.model.nodes["node01"].gpus]


def run_case(rack, work: Path, case: str) -> list[float]:
    work.mkdir(parents=True)
    cfg = config(rack, work, case)
    lat: list[float] = []
    with running_agent(cfg, work) as agent:
        def quiet() -> bool:
            inc = json.loads(agent.get("/api/v1/incidents", token=TOKEN)[1])
            return not [i for i in inc["open"] if i["detector"] == "coolant_flow_low"] and limits(rack) == before
        def open_now() -> list[str]:
            inc = json.loads(agent.get("/api/v1/incidents", token=TOKEN)[1])
            return [f"{i['detector']} {i['targets']}" for i in inc["open"]]
        until(lambda: agent.get("/readyz")[0] == 200, 30, "agent ready")
        before = limits(rack)
        time.sleep(3.0)  # two CDU polls: the flow baseline holds a healthy sample
        for _ in range(RUNS):
            time.sleep(random.uniform(0, 1.0))
            t0 = time.monotonic()
            rack.inject("pump-fail", cdu="cdu1", pump=2)
            until(lambda: all(w < b for w, b in zip(limits(rack), before)), 30, f"{case}: caps applied", step=0.002)
            lat.append(time.monotonic() - t0)
            with rack.sim.model.lock:
                rack.sim.model.coolant.pump_running[1] = True
            until(quiet, 90, f"{case}: recovered and undone (open: {open_now()}, limits {limits(rack)})")
            time.sleep(3.0)  # the baseline sees the healthy loop again
    return lat


def main() -> None:
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as d, sim_rack(Path(d) / "rack") as rack:
        rack.inject("thermal", node="node01", gpu=2, celsius=10)  # one hotter GPU: the margins differ
        for n, case in enumerate(CASES):
            results[case] = run_case(rack, Path(d) / f"case{n}", case)
    print(f"pump loss (pump-fail --cdu cdu1 --pump 2) -> every GPU of node01 reads its new limit, {RUNS} injections "
          "per case (CDU poll 1 s, coolant_flow_low held 2 s as shipped, random phase):")
    for case in CASES:
        p50, p99 = percentiles(results[case])
        print(f"  {case:15s} p50 {p50 * 1000:7.0f} ms   p99 {p99 * 1000:7.0f} ms   "
              f"(all: {', '.join(f'{x * 1000:.0f}' for x in sorted(results[case]))} ms)")
    m50, m99 = percentiles(results["thermal margin"])
    f50, f99 = percentiles(results["flat 60 %"])
    print(f"  thermal margin / flat: p50 {m50 / f50:.2f}x   p99 {m99 / f99:.2f}x")


if __name__ == "__main__":
    main()
