"""NVLink attribution across a rack (issue 34): an NVSwitch chip failing (NVLink K down on every GPU of the
rack, `nvswitch-down`) -> the rack leader's nvlink_switch_fault incident, with 18 real agents on an 18-node GB200
simulated rack (4 GPUs x 18 NVLinks a node) and a real etcd (auth and TLS), at the shipped NVML interval (5 s;
BENCH_NVML_INTERVAL overrides it).

What it waits on is the whole path: each tray's NVML poll reads its link down, its agent publishes its link
vector under links/<node>, every agent's verdict turns switch-side once 3 trays agree, and the leader opens the
incident (its journal's incident row, read through /api/v1/incidents). The peer in the same run: the first
tray's own reading of the link down (supernode_nvlink_up 0 on its /metrics), which is what a per-tray detector
could act on at best. RUNS injections (default 5; BENCH_RUNS), each with a random phase against the poll timers,
each waiting for the verdict to clear on every agent before the next.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from sim.etcd_cluster import EtcdCluster  # noqa: E402
from sim.harness import SimRack  # noqa: E402
from tests.agentproc import AgentProcess  # noqa: E402
from tests.coordination_rack import coordinated_config, incidents, leaders  # noqa: E402
from tests.helpers import free_port, wait_for  # noqa: E402
from timing import percentiles  # noqa: E402

NODES = int(os.environ.get("BENCH_NODES", "18"))
RUNS = int(os.environ.get("BENCH_RUNS", "5"))
NVML_INTERVAL = float(os.environ.get("BENCH_NVML_INTERVAL", "5.0"))


def _verdicts(agent: AgentProcess, chip: int) -> float | None:
    for line in agent.metrics().splitlines():
        if line.startswith("supernode_nvlink_switch_fault{") and f'switch_chip="{chip}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def _link_down_seen(agent: AgentProcess, link: int) -> bool:
    return any(line.startswith("supernode_nvlink_up{") and f'link="{link}"' in line and line.endswith(" 0.0")
               for line in agent.metrics().splitlines())


def main() -> int:
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="bench-attrib-"))
    etcd = EtcdCluster(base / "etcd", 1).start()
    rack = SimRack(base, nodes=NODES, gpus=4, personality="gb200").start()
    agents: list[AgentProcess] = []
    attributed, first_seen = [], []
    try:
        for node in rack.sim.model.nodes:
            work = base / node
            work.mkdir()
            cfg = coordinated_config(rack.sim, node, work, etcd.endpoints)
            cfg["sources"]["nvml"].update(interval=NVML_INTERVAL, timeout=min(3.0, NVML_INTERVAL * 0.6))
            cfg["sources"]["imex"] = {"enabled": False}
            agents.append(AgentProcess(cfg, work))

        def spawn(a: AgentProcess) -> None:
            a.write_config(a.config)
            a._log = open(a.log_path, "ab")
            a.proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "--config", str(a.config_path), "run"],
                                      stdout=a._log, stderr=a._log, cwd=Path(__file__).resolve().parent.parent)

        def all_up() -> bool:
            for a in agents:
                if a.proc.poll() is not None:  # its free port was taken meanwhile: another one
                    a._log.close()
                    a.config["listen"]["port"] = a.port = free_port()
                    spawn(a)
            return all(a.healthy() for a in agents)
        for a in agents:  # all at once, then wait: 18 interpreters one by one take minutes
            spawn(a)
        wait_for(all_up, 300, interval=1, what="agents up")
        wait_for(lambda: len(leaders(agents)) == 1, 120, interval=1, what="one leader")
        wait_for(lambda: all(_verdicts(a, 0) == 0.0 for a in agents), 120, interval=1, what="every verdict read")
        for run in range(RUNS):
            chip = run % 18
            (leader,) = leaders(agents)
            time.sleep(random.uniform(0, NVML_INTERVAL))  # a random phase against the poll timers
            t0 = time.time()
            rack.inject("nvswitch-down", switch=chip)
            seen = wait_for(lambda: next((time.time() for a in agents if _link_down_seen(a, chip)), None), 60,
                            interval=0.05, what="a tray reads the link down")
            inc = wait_for(lambda: [i for i in incidents(leader)["open"] if i["detector"] == "nvlink_switch_fault"
                                    and i["targets"].get("switch_chip") == str(chip)], 60, interval=0.05,
                           what="the leader's nvlink_switch_fault")
            attributed.append(inc[0]["opened_at"] - t0)
            first_seen.append(seen - t0)
            rack.clear()
            wait_for(lambda: all(_verdicts(a, chip) == 0.0 for a in agents), 120, interval=0.5,
                     what="the verdict cleared on every agent")
    finally:
        for a in agents:
            a.stop()
        rack.stop()
        etcd.stop()
    a50, a99 = percentiles(attributed)
    s50, s99 = percentiles(first_seen)
    print(f"nvswitch-down -> the leader's nvlink_switch_fault, {NODES} agents, NVML every {NVML_INTERVAL:g} s, "
          f"{RUNS} runs: p50 {a50:.2f} s, max {max(attributed):.2f} s (aim: under 2 s); the first tray's own "
          f"reading of the link down p50 {s50:.2f} s, max {max(first_seen):.2f} s; p99 {a99:.2f}/{s99:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
