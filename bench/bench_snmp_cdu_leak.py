"""A leak on the rack CDU -> node drained in a real slurmctld, the CDU on SNMP against the same CDU on Modbus TCP,
in one run (issue 37): is the SNMP CDU's leak path as fast as the Modbus one?

Two simulated racks, one per protocol (`supernode-sim demo --cdu-protocol snmp` and the default Modbus), each with
one real agent whose only leak source is cdu1's leak input (the RLE controller, the Redfish services and the
Liebert door are left out of its inventory), polled on the leak schedule (POLL s). Each run flips zone-a wet at a
random phase of the poll timer and takes the drain's result row (written after sinfo read node01 back as
draining/drained) from /api/v1/journal; the leak clears, node01 resumes (dry hold 0) and the next run starts.
The cases alternate run by run so the machine's load falls on both alike. RUNS per case (BENCH_RUNS, default 20).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from sim.demo import agent_config  # noqa: E402
from sim.harness import sim_rack  # noqa: E402
from sim.slurm_cluster import SlurmCluster  # noqa: E402
from tests.agentproc import running_agent  # noqa: E402
from tests.helpers import free_port  # noqa: E402
from timing import machine_reference, percentiles, until  # noqa: E402

POLL = 0.5
RUNS = int(os.environ.get("BENCH_RUNS", "20"))
TOKEN = "bench-token"


def _config(rack, work: Path, cluster: SlurmCluster) -> dict:
    for name in ("admin.token", "webhook.token"):
        (work / name).write_text(TOKEN + "\n")
    cfg = agent_config(rack.sim, "node01", free_port(), work, mode="enforce", slurm_conf=cluster.conf)
    inv = cfg["inventory"]
    inv.update(cdus=[c for c in inv["cdus"] if c["name"] == "cdu1"], leak_controllers=[], redfish=[],
               switch_trays=[])
    inv.pop("rack_units", None)
    for zone in inv["leak_zones"]:
        zone.pop("valve", None)  # the Modbus CDU's valve close waits for a person: the same playbook for both
    cfg["sources"]["leak"] = {"interval": POLL, "timeout": 0.4}
    cfg["remediation"].update({
        "detectors": {"leak": {"clear_seconds": 0.2}, "leak_tray": {"clear_seconds": 0.2}},
        "leak_scope": {"dry_hold_seconds": 0},
        "guardrails": {"automatic": ["resume_after_leak"], "cooldown_seconds": 0, "max_drained_fraction": 1.0,
                       "max_drained_nodes": 2, "breaker_max_actions": 100000, "rate_per_hour": {"default": 100000}}})
    return cfg


def one_run(rack, agent, cluster: SlurmCluster) -> float:
    time.sleep(random.uniform(0, POLL))  # a random phase against the leak poll timer
    t_flip = time.time()
    rack.inject("leak", zone="zone-a")

    def drained() -> list[float]:
        status, body = agent.get("/api/v1/journal?limit=300", token=TOKEN)
        entries = json.loads(body)["entries"] if status == 200 else []
        return [e["ts"] for e in entries if e["ts"] >= t_flip and e["kind"] == "result" and e["action"] == "drain"
                and e["result"] == "done"]
    latency = until(drained, 20, "drained")[0] - t_flip
    rack.clear()

    def settled() -> bool:  # (a leak_source_down notice on a loaded host is no leak: it holds nothing back)
        status, body = agent.get("/api/v1/incidents", token=TOKEN)
        inc = json.loads(body)
        return (not [i for i in inc["open"] if i["detector"] == "leak"] and not inc["pending_approvals"]
                and cluster.states().get("node01") == "idle")
    try:
        until(settled, 60, "leak resolved, node01 resumed")
    except TimeoutError:
        raise TimeoutError(f"leak not resolved or node01 not resumed: {cluster.states()} "
                           f"{agent.get('/api/v1/incidents', token=TOKEN)[1][:2000]!r}") from None
    return latency


def main() -> None:
    reference = machine_reference()
    with tempfile.TemporaryDirectory() as d, ExitStack() as stack:
        work = Path(d)
        cluster = SlurmCluster(names=["node01", "node02"], base=work / "slurm").start()
        stack.callback(cluster.cleanup)
        agents = {}
        for protocol in ("modbus", "snmp"):
            case = work / protocol
            case.mkdir()
            rack = stack.enter_context(sim_rack(case, cdu_protocol=protocol))
            agent = stack.enter_context(running_agent(_config(rack, case, cluster), case))
            until(lambda: 'supernode_source_up{device="cdu1",source="leak"} 1.0' in agent.metrics(), 60,
                  f"{protocol} cdu1 leak source up")
            agents[protocol] = (rack, agent)
        # one agent at a time acts on node01: the other's rack stays dry, its agent idle between its own runs
        latencies: dict[str, list[float]] = {p: [] for p in agents}
        for _ in range(RUNS):
            for protocol, (rack, agent) in agents.items():
                latencies[protocol].append(one_run(rack, agent, cluster))
    print(f"leak on the rack CDU -> node01 drained in slurmctld, {RUNS} runs per protocol, leak poll {POLL}s, random "
          f"phase, cases alternated ({reference}):")
    for protocol, lat in latencies.items():
        p50, p99 = percentiles(lat)
        print(f"  cdu1 over {protocol:6s} drained p50 {p50 * 1000:6.1f} ms  p99 {p99 * 1000:6.1f} ms  "
              f"max {max(lat) * 1000:6.1f} ms")
    m50, _ = percentiles(latencies["modbus"])
    s50, _ = percentiles(latencies["snmp"])
    print(f"  SNMP / Modbus p50: {s50 / m50:.2f}x")


if __name__ == "__main__":
    main()
