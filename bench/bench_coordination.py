"""Rack coordination at scale: requests per second at the shared devices of an 18-node rack, and
leader failover time.

1. Request rates: an 18-node simulated rack (4 GPUs a node) and 18 real agent processes, first without a
   `coordination` section (every agent polls every shared device: today), then with a one-member etcd
   (two pollers per device), and one agent alone (a single poller). Requests are the simulated devices'
   own counters over WINDOW seconds (Modbus requests at the leak controller and the CDU, SNMP requests at
   the PDU), and the distinct clients each saw. Aim: etcd at most 2x a single poller (today 18x).
2. Leak path: on the failover rack below, a leak in the zone of an agent that does not poll the leak
   controller, LEAKS times: leak bit flipped -> that agent's drain intent. Aim: leak poll + 100 ms.
3. Failover: 3 agents on a 3-member etcd, KILLS times: SIGKILL the leader, time until another agent holds
   the leader key (read from etcd every 10 ms), restart the killed agent, wait for the rack to settle.
   p50/p99. Aim: below lease TTL + one leak poll (5.5 s).

4. Leak path with `static` coordination (after part 3; BENCH_STATIC=0 skips it): two configured pollers, each
   publishing every poll on its fact stream, and a third agent reading both: the same injections as part 2.

BENCH_NODES (18; 0 skips part 1), BENCH_WINDOW (20 s), BENCH_KILLS (20; 0 skips parts 2 to 4), BENCH_LEAKS (20)
override the sizes.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from sim.etcd_cluster import EtcdCluster  # noqa: E402
from tests.agentproc import AgentProcess  # noqa: E402
from tests.coordination_rack import (approve, coordinated_config, incidents, is_up, journal, leaders,  # noqa: E402
                                     metric, polls, static_configs)
from tests.helpers import free_port, wait_for  # noqa: E402
from sim.harness import SimRack  # noqa: E402

NODES = int(os.environ.get("BENCH_NODES", "18"))
WINDOW = float(os.environ.get("BENCH_WINDOW", "20"))
KILLS = int(os.environ.get("BENCH_KILLS", "20"))
LEAKS = int(os.environ.get("BENCH_LEAKS", "20"))
STATIC_LEAKS = os.environ.get("BENCH_STATIC", "1") != "0"
TTL = 5.0
DEVICES = (("leak1", "Modbus"), ("cdu1", "Modbus"), ("pdu-a", "SNMP"))


def _counts(sim) -> dict[str, int]:
    out = {}
    for name, _ in DEVICES:
        dev = sim.devices[name]
        out[name] = dev.requests if hasattr(dev, "requests") else dev.agent.requests
    return out


def _clients(sim, name: str) -> int:
    dev = sim.devices[name]
    return (dev.clients if hasattr(dev, "clients") else dev.agent.clients)(5.0)


def _light(cfg: dict) -> dict:
    """A bench agent: its shared-device sources at the demo's rates, its own GPUs and ports slower (18 on 2 cores)."""
    cfg["sources"]["links"] = {"enabled": False}
    cfg["sources"]["dom"] = {"enabled": False}
    cfg["sources"]["nvml"].update(interval=5.0, timeout=3.0)
    return cfg


def rates(base: Path, nodes: int, etcd: EtcdCluster | None, agents_n: int) -> tuple[dict, dict, float]:
    rack = SimRack(base, nodes=nodes, gpus=4).start()
    agents: list[AgentProcess] = []
    try:
        names = list(rack.sim.model.nodes)[:agents_n]
        for node in names:
            work = base / node
            work.mkdir(parents=True, exist_ok=True)
            cfg = _light(coordinated_config(rack.sim, node, work, etcd.endpoints if etcd else ["http://127.0.0.1:9"]))
            if etcd is None:
                del cfg["coordination"]
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
        for a in agents:  # start them all, then wait: 18 interpreters starting one by one take minutes
            spawn(a)
        wait_for(all_up, 300, interval=1, what="agents up")
        if etcd is not None:
            wait_for(lambda: all(is_up(a) for a in agents), 120, interval=1, what="coordinating")
        wait_for(lambda: _clients(rack.sim, "leak1") >= min(2, agents_n) if etcd else True, 60, what="polling")
        time.sleep(5.0)  # settle: slots claimed, first polls done
        c0, t0 = _counts(rack.sim), time.monotonic()
        cpu0 = sum(_cpu(a.proc.pid) for a in agents)
        time.sleep(WINDOW)
        c1, t1 = _counts(rack.sim), time.monotonic()
        cpu = (sum(_cpu(a.proc.pid) for a in agents) - cpu0) / (t1 - t0)
        per_s = {k: (c1[k] - c0[k]) / (t1 - t0) for k in c0}
        clients = {k: _clients(rack.sim, k) for k in c0}
        return per_s, clients, cpu
    finally:
        for a in agents:
            a.stop()
        rack.stop()


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


LEADER_KEY = "/supernode-test/r01/leader"
ZONES = {"node01": "zone-a", "node02": "zone-b", "node03": "zone-c"}


def leak_path(rack: SimRack, reader: AgentProcess, leak_times: list[float]) -> None:
    """LEAKS times: a leak in the zone of `reader` (an agent that does not poll the leak controller), at a random
    phase against the 0.5 s leak poll -> `reader`'s drain intent (wall times: the injection here, the intent's
    row in its journal); the leak cleared and the incident closed before the next."""
    zone = ZONES[reader.config["agent"]["node"]]
    for _ in range(LEAKS):
        seen = {e["seq"] for e in journal(reader)}
        time.sleep(random.uniform(0, 0.5))
        t0 = time.time()
        rack.inject("leak", zone=zone)
        first = wait_for(lambda: [e for e in journal(reader) if e["seq"] not in seen and e["kind"] == "intent"
                                  and e["action"] == "drain"], 30, interval=0.02, what="drain intent")
        leak_times.append(first[0]["ts"] - t0)
        rack.clear()
        wait_for(lambda: not any(i["detector"] == "leak" for i in incidents(reader).get("open", [])), 60,
                 interval=0.2, what="leak resolved")
        for pid in [p["id"] for p in incidents(reader).get("pending_approvals", []) if p["phase"] == "undo"]:
            approve(reader, pid)


def static_leaks(base: Path) -> list[float]:
    """The leak path with `static` coordination: node01 and node02 poll every shared device (both publish each
    poll on their fact streams), node03 polls none and reads both streams."""
    rack = SimRack(base / "static-leak", nodes=3, gpus=2).start()
    agents: list[AgentProcess] = []
    times: list[float] = []
    try:
        shared = ("leak1", "cdu1", "rdhx1", "pdu-a", "rfcdu1")
        for cfg, work in static_configs(rack.sim, base / "static-leak", list(rack.sim.model.nodes),
                                        {d: ["node01", "node02"] for d in shared}):
            agents.append(AgentProcess(_light(cfg), work).start())
        reader = agents[2]
        wait_for(lambda: metric(reader, "supernode_coordination_up", backend="static") == 1.0, 60, what="node03 up")
        wait_for(lambda: all(metric(a, "supernode_source_up", device="leak1", source="leak") == 1.0
                             for a in agents[:2]), 60, what="node01 and node02 polling leak1")
        leak_path(rack, reader, times)
    finally:
        for a in agents:
            a.stop()
        rack.stop()
    return times


def failover(base: Path, leak_times: list[float]) -> list[float]:
    etcd = EtcdCluster(base / "etcd3", 3).start()
    rack = SimRack(base / "fo", nodes=3, gpus=2).start()
    agents = []
    times = []
    try:
        for node in rack.sim.model.nodes:
            work = base / "fo" / node
            work.mkdir(parents=True, exist_ok=True)
            agents.append(AgentProcess(_light(coordinated_config(rack.sim, node, work, etcd.endpoints, ttl=TTL)),
                                       work).start())
        # The leak path through the pollers' facts: leak bit flipped -> the drain intent of a zone agent that
        # does not poll the leak controller (wall times: the injection here, the intent's row there).
        wait_for(lambda: len(leaders(agents)) == 1 and all(is_up(a) for a in agents), 120, interval=0.2,
                 what="settled")
        leak_path(rack, next(a for a in agents if not polls(a, "leak1")), leak_times)
        for i in range(KILLS):
            wait_for(lambda: len(leaders(agents)) == 1 and all(is_up(a) for a in agents), 120, interval=0.2,
                     what="settled")
            leader = leaders(agents)[0]
            name = leader.config["agent"]["node"]
            t0 = time.monotonic()
            os.kill(leader.proc.pid, signal.SIGKILL)
            leader.proc.wait(10)
            new = wait_for(lambda: (v := (etcd.get(LEADER_KEY) or b"").decode()) not in ("", name) and v, 60, interval=0.01,
                           what="new leader")
            times.append(time.monotonic() - t0)
            print(f"  kill {i + 1}: {name} -> {new} in {times[-1]:.2f} s", flush=True)
            leader.stop()
            leader.start()
    finally:
        for a in agents:
            a.stop()
        rack.stop()
        etcd.stop()
    return times


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="bench-coordination-"))
    os.environ["SUPERNODE_SIM_FILE"] = str(base / "sim.json")
    if NODES:
        _rates(base)
    if not KILLS:
        return 0
    print(f"leader failover, {KILLS} SIGKILLs of the leader, lease TTL {TTL:g} s:")
    leak_times: list[float] = []
    times = failover(base, leak_times)
    print(f"leak on a zone whose agent does not poll the controller -> that agent's drain intent, {LEAKS} "
          f"injections: p50 {statistics.median(leak_times) * 1000:.0f} ms, p99 {_pct(leak_times, 0.99) * 1000:.0f} ms "
          f"(aim < leak poll + 100 ms = 600 ms)")
    print(f"failover p50 {statistics.median(times):.2f} s, p99 {_pct(times, 0.99):.2f} s, max {max(times):.2f} s "
          f"(aim < TTL + one leak poll = {TTL + 0.5:g} s)")
    if STATIC_LEAKS:
        static = static_leaks(base)
        print(f"static coordination, the same leak path (two pollers publishing, the zone's agent reading both "
              f"streams), {LEAKS} injections: p50 {statistics.median(static) * 1000:.0f} ms, "
              f"p99 {_pct(static, 0.99) * 1000:.0f} ms")
    return 0


def _rates(base: Path) -> None:
    print(f"{NODES}-node rack, window {WINDOW:g} s; requests/s at each shared device (clients seen in 5 s)")
    single, single_c, single_cpu = rates(base / "single", NODES, None, 1)
    static, static_c, static_cpu = rates(base / "static", NODES, None, NODES)
    etcd = EtcdCluster(base / "etcd1", 1).start()
    try:
        coord, coord_c, coord_cpu = rates(base / "etcd", NODES, etcd, NODES)
    finally:
        etcd.stop()
    print(f"| device | one agent | {NODES} agents, no coordination | {NODES} agents, etcd |")
    print("| --- | --- | --- | --- |")
    for name, proto in DEVICES:
        s = single[name]
        print(f"| {name} ({proto}) | {s:.1f}/s ({single_c[name]}) | {static[name]:.1f}/s ({static_c[name]}, "
              f"{static[name] / s:.1f}x) | {coord[name]:.1f}/s ({coord_c[name]}, {coord[name] / s:.1f}x) |")
    print(f"agents' CPU: one {single_cpu * 100:.1f} % of a core; {NODES} without coordination "
          f"{static_cpu * 100:.1f} %; {NODES} with etcd {coord_cpu * 100:.1f} %")


if __name__ == "__main__":
    raise SystemExit(main())
