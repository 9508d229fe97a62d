"""Benchmark: what one agent costs on its node, against what its polls alone cost, in the demo layout.

One demo node (4 GPUs x 18 NVLinks on the NVML twin, 4 ports with optics, 2 CDUs and a leak
controller over Modbus TCP, a Raritan PDU over SNMP, remediation in enforce mode with the simulated
scheduler) at the demo's intervals (NVML, links, CDUs, PDU every 1 s, leak every 0.5 s, DOM every 5 s).
The simulator runs in a process of its own, so nothing it does is counted.

Printed:
- the agent process's CPU as a percentage of one core over --seconds (default 120), after a warm-up:
  the median of --windows (default 4) equal windows of that span, with their range (this VM's speed
  moves within minutes: one figure over the whole span hides how much), and its resident memory at the
  end;
- the same run's per-source poll costs: every source of the same config polled alone in this process,
  median CPU per poll divided by its interval, summed: the CPU the polls alone need; and the ratio
  agent CPU / polls' CPU (aim <= 1.5: overhead around the polls is small). A poll is measured paced
  at its source's interval (at most 2 s apart; --paced-seconds per source), as the agent polls it:
  a poll after an idle gap costs up to twice one run back to back with warm caches. The back-to-back
  figure is printed too, as a lower bound;
- the wake-up floor: how often the agent was woken in its windows (voluntary context switches of its
  event loop and of its other threads, a second; preemptions are printed apart), and the CPU of a
  bare process woken as often with nothing else to do (bench/wake_floor.py, --floor-seconds, run
  while the agent runs): what this machine charges before any work, so the agent's figure can be
  read against it.

With --default-intervals the same node runs at the shipped defaults instead (NVML, links, CDUs, PDU
every 5 s, DOM every 30 s, leak every 0.5 s), as a production agent would.

--layout says which node:
- `issue` (default): the node above, issue 14's layout, without the Redfish services the simulator
  also serves;
- `demo`: what `make demo` runs now: the same node plus its tray's BMC and the rack's Redfish CDU over
  HTTPS (every 2 s, events over SSE), every node's agent (two), and, when etcd is installed, rack
  coordination through a one-member etcd (leases, watches, shared polls). Each agent's CPU is printed;
  the polls' costs and the ratio are node01's.

    python bench/bench_overhead.py [--seconds 120] [--polls 20] [--paced-seconds 10] [--floor-seconds 30]
                                   [--default-intervals] [--layout issue|demo]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.memory import daemon_env  # noqa: E402
from sim.ports import free_port  # noqa: E402
from timing import machine_reference  # noqa: E402
from wake_floor import context_switches, floor_percent  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def _simulator(conn, workdir: str, default_intervals: bool, layout: str) -> None:
    """Child process: the simulated rack (and etcd, for the demo layout), and the configs of the agents
    to run sent back to the parent (node01's first)."""
    from sim.demo import agent_config
    from sim.etcd_cluster import EtcdCluster, etcd_binary
    from sim.harness import sim_rack

    etcd = None
    with sim_rack(Path(workdir)) as rack:
        try:
            nodes = list(rack.sim.model.nodes) if layout == "demo" else ["node01"]
            if layout == "demo" and etcd_binary():
                etcd = EtcdCluster(Path(workdir) / "etcd", 1, memory=True).start()
            ports = {node: free_port() for node in nodes}
            urls = {node: f"http://127.0.0.1:{port}" for node, port in ports.items()}
            cfgs = []
            for node, port in ports.items():
                cfg = agent_config(rack.sim, node, port, Path(workdir), mode="enforce",
                                   agent_urls=urls if layout == "demo" else None,
                                   etcd_endpoints=etcd.endpoints if etcd else None)
                if etcd is not None:  # as the demo: the node's own etcd user, over TLS
                    etcd.authorize(cfg, Path(workdir) / node)
                cfg["remediation"]["slurm"] = {"backend": "simulated"}
                if layout == "issue":  # the Redfish services came after the issue: not in its layout
                    cfg["inventory"].pop("redfish", None)
                    cfg["sources"].pop("redfish", None)
                    cfg["secrets"].pop("redfish", None)
                if default_intervals:
                    for settings in cfg["sources"].values():
                        if isinstance(settings, dict):
                            settings.pop("interval", None)
                            settings.pop("timeout", None)
                cfgs.append(cfg)
            conn.send((cfgs, bool(etcd)))
            conn.recv()  # until the parent is done
        finally:
            if etcd is not None:
                etcd.stop()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _wait_healthy(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("the agent did not become ready")


async def _poll_costs(config_path: Path, polls: int, paced_seconds: float) -> list[tuple[str, float, float, float]]:
    """(source/device, median CPU seconds per poll paced at its interval, the same back to back, interval).

    Paced: each source alone, one poll per interval (at most 2 s apart) as the agent polls it, for about
    `paced_seconds` (at least 5 polls): what a poll costs at the agent's cadence, caches cold from the
    idle gap between polls. Back to back (`polls` polls in a row): the same work with warm caches, a
    lower bound.
    """
    from agent.config import load_config
    from agent.sources import build_sources

    async def one(src, timeout: float) -> float:
        c0 = time.process_time()
        try:
            await asyncio.wait_for(src.poll(), timeout)
        except Exception:  # a failed poll still cost what it cost
            pass
        return time.process_time() - c0

    out = []
    for scheduled in build_sources(load_config(config_path)):
        src, interval, timeout = scheduled.source, scheduled.settings.interval, scheduled.settings.timeout * 4
        gap = min(interval, 2.0)
        await one(src, timeout)  # first poll: connections, static facts
        paced = []
        for _ in range(max(5, int(paced_seconds / gap))):
            start = time.monotonic()
            paced.append(await one(src, timeout))
            await asyncio.sleep(max(0.0, start + gap - time.monotonic()))
        warm = [await one(src, timeout) for _ in range(polls)]
        close = getattr(src, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                await result
        out.append((f"{src.name}/{src.device}", statistics.median(paced), statistics.median(warm), interval))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--windows", type=int, default=4, help="the agent's CPU is the median of this many windows")
    ap.add_argument("--polls", type=int, default=20, help="back-to-back polls per source")
    ap.add_argument("--paced-seconds", type=float, default=10.0, help="how long each source is polled at its interval")
    ap.add_argument("--floor-seconds", type=float, default=30.0, help="how long the wake-up floor's peer runs")
    ap.add_argument("--default-intervals", action="store_true", help="the shipped intervals, not the demo's")
    ap.add_argument("--layout", choices=("issue", "demo"), default="issue",
                    help="issue 14's node (default), or what `make demo` runs now (Redfish, every agent, etcd)")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    for name in ("admin.token", "webhook.token"):
        (workdir / name).write_text("bench-token\n")
        (workdir / name).chmod(0o600)
    parent, child = multiprocessing.Pipe()
    sim = multiprocessing.get_context("spawn").Process(
        target=_simulator, args=(child, str(workdir), args.default_intervals, args.layout), daemon=True)
    sim.start()
    cfgs, coordinated = parent.recv()
    agents: list[tuple[str, subprocess.Popen]] = []
    logs = []
    try:
        for cfg in cfgs:
            node = cfg["agent"]["node"]
            config_path = workdir / node / "agent.yaml"
            config_path.parent.mkdir(parents=True, exist_ok=True)
            config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            logs.append(open(workdir / node / "agent.log", "ab"))
            agents.append((node, subprocess.Popen([sys.executable, "-m", "agent.cli", "--config", str(config_path), "run"],
                                                  stdout=logs[-1], stderr=logs[-1], cwd=REPO, env=daemon_env())))
        for cfg in cfgs:
            _wait_healthy(cfg["listen"]["port"], time.monotonic() + 60)
        time.sleep(args.warmup)
        n_windows = max(1, args.windows)
        first = agents[0][1].pid
        switched = [context_switches(first)]
        marks = [([_cpu_seconds(a.pid) for _, a in agents], time.monotonic())]
        for _ in range(n_windows):
            time.sleep(args.seconds / n_windows)
            marks.append(([_cpu_seconds(a.pid) for _, a in agents], time.monotonic()))
        switched.append(context_switches(first))
        rss = [_rss_mib(a.pid) for _, a in agents]
        span = marks[-1][1] - marks[0][1]
        loop_wakes, thread_wakes, preempted = ((after - before) / span for before, after in zip(*switched))
        floor = floor_percent(loop_wakes, thread_wakes, args.floor_seconds, env=daemon_env())
        costs = asyncio.run(_poll_costs(workdir / "node01" / "agent.yaml", args.polls, args.paced_seconds))
    finally:
        for _, agent in agents:
            agent.send_signal(signal.SIGTERM)
        for _, agent in agents:
            try:
                agent.wait(10)
            except subprocess.TimeoutExpired:
                agent.kill()
        parent.send("stop")
        sim.join(20)
        for log in logs:
            log.close()

    # per agent: its CPU % in each window
    windows = [[100 * (c1[k] - c0[k]) / (t1 - t0) for (c0, t0), (c1, t1) in zip(marks, marks[1:])]
               for k in range(len(agents))]
    pcts = [statistics.median(w) for w in windows]
    print(f"machine: {machine_reference()}")
    if args.layout == "demo":
        print(f"layout: demo ({len(agents)} agents, Redfish BMC and CDU, "
              f"{'etcd coordination' if coordinated else 'no etcd installed: static coordination'})")
        for (node, _), pct, w, mib in zip(agents, pcts, windows, rss):
            print(f"  {node}: {pct:.2f} % of a core ({min(w):.2f}-{max(w):.2f}), {mib:.1f} MiB")
    agent_pct, rss = pcts[0], rss[0]
    paced_pct = 100 * sum(cpu / interval for _, cpu, _, interval in costs)
    warm_pct = 100 * sum(cpu / interval for _, _, cpu, interval in costs)
    print(f"agent CPU: {agent_pct:.2f} % of a core, median of {n_windows} windows over {span:.0f} s "
          f"(range {min(windows[0]):.2f}-{max(windows[0]):.2f} %); resident memory {rss:.1f} MiB")
    print(f"  {'poll':29s} {'paced':>9s} {'back-to-back':>13s}  every")
    for name, paced, warm, interval in costs:
        print(f"  {name:29s} {paced * 1000:6.2f} ms {warm * 1000:10.2f} ms  {interval:g} s = {100 * paced / interval:.2f} %")
    print(f"polls alone, paced at their intervals: {paced_pct:.2f} % of a core; ratio agent / polls: "
          f"{agent_pct / paced_pct:.2f}x")
    print(f"polls alone, back to back (warm caches, a lower bound): {warm_pct:.2f} %; ratio {agent_pct / warm_pct:.2f}x")
    print(f"wake-ups: {loop_wakes + thread_wakes:.1f} a second ({loop_wakes:.1f} on the event loop, {thread_wakes:.1f} "
          f"on other threads; besides, {preempted:.1f} preemptions a second); "
          f"a bare process woken as often, nothing else to do (peer, same run): {floor:.2f} % of a core; "
          f"the agent above that floor: {agent_pct - floor:.2f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
