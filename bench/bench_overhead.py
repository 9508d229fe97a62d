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

- where the time goes (`--profile`, on by default): each agent runs agent/cpu_profile.py's sampler (SIGPROF
  every 4 ms of the process's own CPU; each thread's CPU charged to the component its stack is in), over the
  same span as its windows, printed per agent as % of a core by component (Redfish polls, sessions and SSE;
  etcd keep-alive, watch, fact puts; fact encode/decode; timers; the event loop...), with the sampler's own
  cost (left out of the components, but in the agent's figure: --no-profile measures without it).

--layout says which node:
- `issue` (default): the node above, issue 14's layout, without the Redfish services the simulator
  also serves;
- `demo`: what `make demo` runs now: the same node plus its tray's BMC and the rack's Redfish CDU over
  HTTPS (every 2 s, events over SSE), every node's agent (two), and, when etcd is installed, rack
  coordination through a one-member etcd (leases, watches, shared polls). Each agent is reported apart
  (its role: leader or follower; its CPU, memory, wake-ups, floor, polls and ratio, profile). The polls of a
  source both agents have (the rack's shared devices) are measured once. A Redfish service polls every
  `confirmed_interval` while its event stream is up (the steady state), so that is its interval here.

With more than 4 windows (e.g. --seconds 1800 --windows 30: the 30-minute memory curve) each agent's resident
memory at each window's end is printed too.

The last lines are what README's performance table row needs (`README row:`), for a run on a quiet machine.

    python bench/bench_overhead.py [--seconds 120] [--polls 20] [--paced-seconds 10] [--floor-seconds 30]
                                   [--default-intervals] [--layout issue|demo]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.config import load_config  # noqa: E402
from agent.coordination.shared import shared_devices  # noqa: E402
from agent.cpu_profile import ENV as CPU_PROFILE_ENV  # noqa: E402
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


def _memory_parts(pid: int) -> dict[str, float]:
    """What the resident memory is made of (MiB, /proc/PID/smaps_rollup): `anon` the agent's own (heap, Python
    objects), `file` pages of files mapped (the interpreter, libcrypto, pydantic-core...: shared with every other
    process that maps them, and the kernel can drop them), `pss` its proportional share of all of it."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            fields[name] = int(rest.split()[0]) / 1024
    return {"anon": fields.get("Anonymous", 0.0), "file": fields.get("Rss", 0.0) - fields.get("Anonymous", 0.0),
            "pss": fields.get("Pss", 0.0)}


def _set(cfg: dict, setting: str) -> None:
    """KEY=VALUE (a dotted path, a YAML value) into an agent's config, making the sections on the way."""
    path, _, value = setting.partition("=")
    *parents, key = path.split(".")
    node = cfg
    for name in parents:
        node = node.setdefault(name, {})
    node[key] = yaml.safe_load(value)


def _role(port: int) -> str:
    """leader, follower or degraded (supernode_coordination_leader / _up on its /metrics); "alone" without."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return "unknown"
    leads = [line for line in text.splitlines() if line.startswith("supernode_coordination_leader{")]
    if not leads:
        return "alone"
    return "leader" if any(line.endswith(" 1.0") or line.endswith(" 1") for line in leads) else "follower"


def _profile_window(agents: list[tuple[str, subprocess.Popen]], files: list[Path]) -> list[dict | None]:
    """Ask each agent for its sampler's window (SIGUSR2) and read it back; None where none came."""
    for path in files:
        path.unlink(missing_ok=True)
    for _, agent in agents:
        agent.send_signal(signal.SIGUSR2)
    out: list[dict | None] = []
    deadline = time.monotonic() + 10
    for path in files:
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        out.append(json.loads(path.read_text()) if path.exists() else None)
    return out


def _print_profile(node: str, window: dict | None, leaves: int = 0) -> None:
    if window is None:
        print(f"  {node}: no profile came back")
        return
    wall, comps = window["wall_s"], window["components"]
    unseen = max(0.0, window["process_cpu_s"] - window["sampler_cpu_s"] - sum(comps.values()))
    print(f"  where {node}'s CPU goes ({window['samples']} samples over {wall:.0f} s; the process "
          f"{100 * window['process_cpu_s'] / wall:.2f} % of a core, of which the sampler itself "
          f"{100 * window['sampler_cpu_s'] / wall:.3f} %, threads that ended or no Python thread "
          f"{100 * unseen / wall:.2f} %):")
    for name, cpu in comps.items():
        print(f"    {name:34s} {100 * cpu / wall:5.2f} %")
    for frame, cpu in list(window["leaves"].items())[:leaves]:
        print(f"      {100 * cpu / wall:5.2f} %  {frame}")


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


async def _poll_costs(config_path: Path, polls: int, paced_seconds: float, skip: set[str] | None = None
                      ) -> list[tuple[str, float, float, float]]:
    """(source/device, median CPU seconds per poll paced at its interval, the same back to back, interval).

    Paced: each source alone, one poll per interval (at most 2 s apart) as the agent polls it, for about
    `paced_seconds` (at least 5 polls): what a poll costs at the agent's cadence, caches cold from the
    idle gap between polls. Back to back (`polls` polls in a row): the same work with warm caches, a
    lower bound.
    """
    from agent.sources import build_sources

    async def bounded(aw, timeout: float, what: str) -> None:
        """Await `aw` for at most `timeout` s; past it, cancel it without waiting for the cancellation to land (a
        client that swallows a cancel must not hold the bench: seen once, an idle loop for minutes)."""
        task = asyncio.ensure_future(aw)
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            print(f"  ({what}: no answer within {timeout:g} s, left behind)", file=sys.stderr)
        elif not task.cancelled():
            task.exception()  # a failed poll still cost what it cost

    async def one(src, timeout: float) -> float:
        c0 = time.process_time()
        await bounded(src.poll(), timeout, f"a poll of {src.name}/{src.device}")
        return time.process_time() - c0

    out = []
    for scheduled in build_sources(load_config(config_path)):
        src, timeout = scheduled.source, scheduled.settings.timeout * 4
        if skip is not None and f"{src.name}/{src.device}" in skip:
            continue
        # a Redfish service with its event stream up polls every confirmed_interval (the steady state)
        interval = getattr(src, "confirmed_poll_s", 0.0) or scheduled.settings.interval
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
            if asyncio.iscoroutine(result):  # as the agent closes a source: bounded
                await bounded(result, 2.0, f"closing {src.name}/{src.device}")
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
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config setting for every agent, dotted path and a YAML value (an A/B of one setting, "
                         "e.g. sources.redfish.confirmed_interval=0); may be repeated")
    ap.add_argument("--profile-leaves", type=int, default=0, help="also print each agent's N costliest innermost frames")
    ap.add_argument("--no-profile", dest="profile", action="store_false",
                    help="run the agents without the CPU sampler (agent/cpu_profile.py)")
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
    profiles = [workdir / cfg["agent"]["node"] / "cpu-profile.json" for cfg in cfgs]
    try:
        for cfg, profile in zip(cfgs, profiles):
            node = cfg["agent"]["node"]
            config_path = workdir / node / "agent.yaml"
            config_path.parent.mkdir(parents=True, exist_ok=True)
            for setting in args.set:
                _set(cfg, setting)
            config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
            logs.append(open(workdir / node / "agent.log", "ab"))
            env = daemon_env()
            if args.profile:
                env[CPU_PROFILE_ENV] = str(profile)
            agents.append((node, subprocess.Popen([sys.executable, "-m", "agent.cli", "--config", str(config_path), "run"],
                                                  stdout=logs[-1], stderr=logs[-1], cwd=REPO, env=env)))
        for cfg in cfgs:
            _wait_healthy(cfg["listen"]["port"], time.monotonic() + 60)
        time.sleep(args.warmup)
        n_windows = max(1, args.windows)
        if args.profile:
            _profile_window(agents, profiles)  # the sampler's window starts with the first one
        switched = [[context_switches(a.pid) for _, a in agents]]
        load = [os.getloadavg()[0]]
        marks = [([_cpu_seconds(a.pid) for _, a in agents], time.monotonic())]
        curve = [[_rss_mib(a.pid) for _, a in agents]]  # each agent's resident memory at each window's end
        for _ in range(n_windows):
            time.sleep(args.seconds / n_windows)
            marks.append(([_cpu_seconds(a.pid) for _, a in agents], time.monotonic()))
            load.append(os.getloadavg()[0])
            curve.append([_rss_mib(a.pid) for _, a in agents])
        switched.append([context_switches(a.pid) for _, a in agents])
        windows_profile = _profile_window(agents, profiles) if args.profile else [None] * len(agents)
        roles = [_role(cfg["listen"]["port"]) for cfg in cfgs]
        rss = [_rss_mib(a.pid) for _, a in agents]
        parts = [_memory_parts(a.pid) for _, a in agents]
        span = marks[-1][1] - marks[0][1]
        wakes = [tuple((after - before) / span for before, after in zip(b, a)) for b, a in zip(*switched)]
        with ThreadPoolExecutor(len(agents)) as pool:  # each agent's floor peer, all at once, the agents running
            floors = list(pool.map(lambda w: floor_percent(w[0], w[1], args.floor_seconds, env=daemon_env()), wakes))
        costs = [asyncio.run(_poll_costs(workdir / agents[0][0] / "agent.yaml", args.polls, args.paced_seconds))]
        shared = set(shared_devices(load_config(workdir / agents[0][0] / "agent.yaml").config.inventory).jobs)
        for node, _ in agents[1:]:  # the rack's shared devices were measured with the first agent's
            costs.append([c for c in costs[0] if c[0] in shared] + asyncio.run(_poll_costs(
                workdir / node / "agent.yaml", args.polls, args.paced_seconds, skip=shared)))
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

    reference = machine_reference()
    # per agent: its CPU % and its CPU seconds in each window
    windows = [[100 * (c1[k] - c0[k]) / (t1 - t0) for (c0, t0), (c1, t1) in zip(marks, marks[1:])]
               for k in range(len(agents))]
    seconds = [marks[-1][0][k] - marks[0][0][k] for k in range(len(agents))]
    print(f"machine: {reference}; load average over the windows {min(load):.1f}-{max(load):.1f}")
    if args.layout == "demo":
        print(f"layout: demo ({len(agents)} agents, Redfish BMC and CDU, "
              f"{'etcd coordination' if coordinated else 'no etcd installed: static coordination'})")
    intervals = "shipped intervals" if args.default_intervals else "the demo's intervals"
    summary = []
    for k, (node, _) in enumerate(agents):
        pct = statistics.median(windows[k])
        loop_wakes, thread_wakes, preempted = wakes[k]
        paced_pct = 100 * sum(cpu / interval for _, cpu, _, interval in costs[k])
        warm_pct = 100 * sum(cpu / interval for _, _, cpu, interval in costs[k])
        print(f"{node} ({roles[k]}): {pct:.2f} % of a core, median of {n_windows} windows over {span:.0f} s "
              f"(range {min(windows[k]):.2f}-{max(windows[k]):.2f} %; {seconds[k]:.2f} CPU seconds in all); "
              f"resident memory {rss[k]:.1f} MiB ({parts[k]['anon']:.1f} anonymous: its own heap and objects; "
              f"{parts[k]['file']:.1f} of mapped files, shared; proportional share {parts[k]['pss']:.1f})")
        print(f"  {'poll':29s} {'paced':>9s} {'back-to-back':>13s}  every")
        for name, paced, warm, interval in costs[k]:
            print(f"  {name:29s} {paced * 1000:6.2f} ms {warm * 1000:10.2f} ms  {interval:g} s = "
                  f"{100 * paced / interval:.2f} %")
        print(f"  polls alone, paced at their intervals: {paced_pct:.2f} % of a core; ratio agent / polls: "
              f"{pct / paced_pct:.2f}x")
        print(f"  polls alone, back to back (warm caches, a lower bound): {warm_pct:.2f} %; ratio {pct / warm_pct:.2f}x")
        print(f"  wake-ups: {loop_wakes + thread_wakes:.1f} a second ({loop_wakes:.1f} on the event loop, "
              f"{thread_wakes:.1f} on other threads; besides, {preempted:.1f} preemptions a second); a bare process "
              f"woken as often, nothing else to do (peer, same run): {floors[k]:.2f} % of a core; the agent above "
              f"that floor: {pct - floors[k]:.2f} %")
        if n_windows > 4:  # a long run: how the memory moved (baselines filling, or a leak)
            print(f"  resident memory at each window's end (MiB, {args.seconds / n_windows:g} s apart, from "
                  f"{args.warmup:g} s after ready): " + " ".join(f"{c[k]:.1f}" for c in curve))
        if args.profile:
            _print_profile(node, windows_profile[k], args.profile_leaves)
        summary.append(f"{node} ({roles[k]}) {pct:.2f} % (windows {min(windows[k]):.2f}-{max(windows[k]):.2f} %), "
                       f"{rss[k]:.1f} MiB ({parts[k]['anon']:.1f} anonymous), "
                       f"polls alone {paced_pct:.2f} % ({pct / paced_pct:.2f}x), floor "
                       f"{floors[k]:.2f} % (above it {pct - floors[k]:.2f} %), {sum(wakes[k][:2]):.1f} wake-ups/s")
    if args.set:
        print(f"settings changed for this run: {', '.join(args.set)}")
    print(f"README row: {time.strftime('%Y-%m-%d')}, {args.layout} layout at the {intervals}, "
          f"{reference.split(', ', 1)[1].split(' (')[0]}, load average {min(load):.1f}-{max(load):.1f}: "
          + "; ".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
