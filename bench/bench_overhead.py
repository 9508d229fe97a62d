"""Benchmark: what one agent costs on its node, against what its polls alone cost, in the demo layout.

One demo node (4 GPUs x 18 NVLinks on the NVML twin, 4 ports with optics, 2 CDUs and a leak
controller over Modbus TCP, a Raritan PDU over SNMP, remediation in enforce mode with the simulated
scheduler) at the demo's intervals (NVML, links, CDUs, PDU every 1 s, leak every 0.5 s, DOM every 5 s).
The simulator runs in a process of its own, so nothing it does is counted.

Printed:
- the agent process's CPU as a percentage of one core over --seconds (default 120), after a warm-up,
  and its resident memory at the end;
- the same run's per-source poll costs: every source of the same config polled alone in this process,
  median CPU per poll divided by its interval, summed: the CPU the polls alone need; and the ratio
  agent CPU / polls' CPU (aim <= 1.5: overhead around the polls is small). A poll is measured paced
  at its source's interval (at most 2 s apart; --paced-seconds per source), as the agent polls it:
  a poll after an idle gap costs up to twice one run back to back with warm caches. The back-to-back
  figure is printed too, as a lower bound.

With --default-intervals the same node runs at the shipped defaults instead (NVML, links, CDUs, PDU
every 5 s, DOM every 30 s, leak every 0.5 s), as a production agent would.

    python bench/bench_overhead.py [--seconds 120] [--polls 20] [--paced-seconds 10] [--default-intervals]
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
sys.path.insert(0, str(REPO / "tests"))

TICK = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _simulator(conn, workdir: str, default_intervals: bool) -> None:
    """Child process: the simulated rack, and node01's demo config sent back to the parent."""
    from agent.demo import agent_config
    from simrack import sim_rack

    with sim_rack(Path(workdir)) as rack:
        cfg = agent_config(rack.sim, "node01", _free_port(), Path(workdir), mode="enforce")
        cfg["remediation"]["slurm"] = {"backend": "simulated"}
        if default_intervals:
            for settings in cfg["sources"].values():
                if isinstance(settings, dict):
                    settings.pop("interval", None)
                    settings.pop("timeout", None)
        conn.send(cfg)
        conn.recv()  # until the parent is done


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
    ap.add_argument("--polls", type=int, default=20, help="back-to-back polls per source")
    ap.add_argument("--paced-seconds", type=float, default=10.0, help="how long each source is polled at its interval")
    ap.add_argument("--default-intervals", action="store_true", help="the shipped intervals, not the demo's")
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    for name in ("admin.token", "webhook.token"):
        (workdir / name).write_text("bench-token\n")
        (workdir / name).chmod(0o600)
    parent, child = multiprocessing.Pipe()
    sim = multiprocessing.get_context("spawn").Process(target=_simulator, args=(child, str(workdir), args.default_intervals),
                                                       daemon=True)
    sim.start()
    cfg = parent.recv()
    config_path = workdir / "node01" / "agent.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    log = open(workdir / "agent.log", "ab")
    agent = subprocess.Popen([sys.executable, "-m", "agent.cli", "--config", str(config_path), "run"],
                             stdout=log, stderr=log, cwd=REPO)
    try:
        _wait_healthy(cfg["listen"]["port"], time.monotonic() + 60)
        time.sleep(args.warmup)
        c0, t0 = _cpu_seconds(agent.pid), time.monotonic()
        time.sleep(args.seconds)
        c1, t1 = _cpu_seconds(agent.pid), time.monotonic()
        rss = _rss_mib(agent.pid)
        costs = asyncio.run(_poll_costs(config_path, args.polls, args.paced_seconds))
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
        parent.send("stop")
        sim.join(20)
        log.close()

    agent_pct = 100 * (c1 - c0) / (t1 - t0)
    paced_pct = 100 * sum(cpu / interval for _, cpu, _, interval in costs)
    warm_pct = 100 * sum(cpu / interval for _, _, cpu, interval in costs)
    print(f"agent CPU: {agent_pct:.2f} % of a core over {t1 - t0:.0f} s; resident memory {rss:.1f} MiB")
    print(f"  {'poll':29s} {'paced':>9s} {'back-to-back':>13s}  every")
    for name, paced, warm, interval in costs:
        print(f"  {name:29s} {paced * 1000:6.2f} ms {warm * 1000:10.2f} ms  {interval:g} s = {100 * paced / interval:.2f} %")
    print(f"polls alone, paced at their intervals: {paced_pct:.2f} % of a core; ratio agent / polls: "
          f"{agent_pct / paced_pct:.2f}x")
    print(f"polls alone, back to back (warm caches, a lower bound): {warm_pct:.2f} %; ratio {agent_pct / warm_pct:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
