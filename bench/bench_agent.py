"""Benchmark: the agent on a node of 8 GPUs x 18 NVLinks (NVML twin): /metrics render, series, resident memory.

Prints medians of repeated runs:
- render: time to render the whole exposition from the snapshot in process
  (our custom collector), against prometheus_client's own Gauge/Counter
  objects holding the same series in the same run (the named peer; ratio);
- scrape: wall time of GET /metrics on a running agent process (HTTP included), plain and gzip
  (as Prometheus asks), with the bytes each sends;
- series count;
- resident memory of the agent process after --minutes of polling at 1 s
  (default 10), against a bare interpreter that imported the same modules.

    python bench/bench_agent.py [--minutes 10] [--runs 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest  # noqa: E402

from agent.exposition import build_registry, render_metrics  # noqa: E402
from sim.ports import free_port  # noqa: E402
from sim.nvml_twin import NvmlTwin  # noqa: E402
from agent.snapshot import SnapshotStore  # noqa: E402
from exporters.model import Kind  # noqa: E402
from exporters.gpu.nvml import NvmlSource  # noqa: E402
from timing import median_wall_cpu  # noqa: E402

GPUS, LINKS = 8, 18


def _median_ms(fn, runs: int) -> float:
    return median_wall_cpu(fn, runs)[0] * 1000


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _wait_http(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def render_comparison(sim_url: str, runs: int) -> tuple[float, float, int]:
    """Our collector vs prometheus_client's own metric objects holding the same samples."""
    lib = NvmlTwin(sim_url, "node01")
    src = NvmlSource(lib, GPUS, LINKS, call_timeout=5.0, xid_events=False)
    readings = asyncio.run(src.poll()).readings
    asyncio.run(src.close())
    store = SnapshotStore()
    store.register("nvml", "gpus", 1.0, 2.0)
    store.publish("nvml", "gpus", readings, 0.01)
    registry = build_registry(store, lambda: {"rack": "r01", "node": "node01", "role": "compute", "version": "b",
                                              "mode": "observe"})
    peer = CollectorRegistry()
    families: dict[str, object] = {}
    for r in readings:
        if not r.ok:
            continue
        labels = sorted(r.labels)
        metric = families.get(r.spec.name)
        if metric is None:
            cls = Counter if r.spec.kind is Kind.COUNTER else Gauge
            metric = cls(r.spec.name.removesuffix("_total") if cls is Counter else r.spec.name, r.spec.help,
                         labels, registry=peer)
            families[r.spec.name] = metric
        child = metric.labels(**r.labels) if labels else metric
        if isinstance(child, Counter) or getattr(child, "_type", "") == "counter":
            child.inc(r.value)
        else:
            child.set(r.value)
    def ours() -> bytes:
        return render_metrics(registry, store)

    series = sum(1 for line in ours().decode().splitlines() if line and not line.startswith("#"))
    return _median_ms(ours, runs), _median_ms(lambda: generate_latest(peer), runs), series


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-agent-"))
    env = {**os.environ, "SUPERNODE_SIM_FILE": str(work / "sim.json")}
    sim = subprocess.Popen([sys.executable, "-m", "sim.cli", "run", "--nodes", "1", "--gpus", str(GPUS)],
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    agent = None
    try:
        sim_url = sim.stdout.readline().split()[1]
        _wait_http(sim_url + "/api/v1/state", time.monotonic() + 20)
        render_ms, peer_ms, series = render_comparison(sim_url, args.runs)
        port = free_port()
        (work / "admin.token").write_text("x\n")
        cfg = {"agent": {"rack": "r01", "node": "node01", "state_dir": str(work / "state")},
               "listen": {"address": "127.0.0.1", "port": port},
               "inventory": {"nodes": ["node01"], "gpus": {"count": GPUS, "nvlinks_per_gpu": LINKS}},
               "sources": {"nvml": {"backend": "sim", "sim_url": sim_url, "interval": 1.0, "timeout": 1.0}},
               "remediation": {"slurm": {"backend": "simulated"}}}
        (work / "agent.yaml").write_text(yaml.safe_dump(cfg))
        agent = subprocess.Popen([sys.executable, "-m", "agent.cli", "--config", str(work / "agent.yaml"), "run"],
                                 cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}/metrics"
        _wait_http(url, time.monotonic() + 20)
        time.sleep(2)  # let the first polls land: this is a benchmark's settling time, not a test's sync

        sizes: dict[str, int] = {}

        def scrape(accept_encoding: str = "") -> None:
            headers = {"Accept-Encoding": accept_encoding} if accept_encoding else {}
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as resp:
                sizes[accept_encoding or "plain"] = len(resp.read())

        scrape_ms = _median_ms(scrape, args.runs)
        scrape_gzip_ms = _median_ms(lambda: scrape("gzip"), args.runs)  # what Prometheus asks for
        rss_start = _rss_kib(agent.pid)
        time.sleep(args.minutes * 60)
        rss_end = _rss_kib(agent.pid)
        baseline = subprocess.run([sys.executable, "-c", "import agent.daemon, agent.sources, exporters.gpu.nvml, "
                                   "sim.nvml_twin, agent.remediation.wiring, resource; "
                                   "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
                                  cwd=REPO, capture_output=True, text=True, check=True)
        base_kib = int(baseline.stdout.strip())
        result = {
            "series": series,
            "render_ms_median": round(render_ms, 2),
            "render_peer_prometheus_client_objects_ms": round(peer_ms, 2),
            "render_ratio_vs_peer": round(render_ms / peer_ms, 2),
            "scrape_http_ms_median": round(scrape_ms, 2),
            "scrape_http_gzip_ms_median": round(scrape_gzip_ms, 2),
            "scrape_bytes_plain": sizes["plain"],
            "scrape_bytes_gzip": sizes["gzip"],
            "rss_mib_at_start": round(rss_start / 1024, 1),
            f"rss_mib_after_{args.minutes:g}_min": round(rss_end / 1024, 1),
            "rss_mib_bare_interpreter_same_imports": round(base_kib / 1024, 1),
        }
        print(json.dumps(result, indent=2))
    finally:
        for p in (agent, sim):
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
