"""Benchmark: one NVML collection cycle for a node of 8 GPUs x 18 NVLinks on the twin.

Prints the median CPU time (this process: exporter + twin client; the
simulator's HTTP server runs in a separate process, as in production) and
wall time of one cycle, HTTP requests per cycle and the series count. The
named peer of the ratio is the twin's own cost: the same cycle with the
exporter's work removed (only the one state fetch), so the ratio says what
share of a cycle is the exporter itself. Rendering /metrics is benchmarked
by the agent's own bench.

    python bench/bench_nvml.py [--runs 50] [--personality h100|gb200]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.nvml_twin import NvmlTwin  # noqa: E402
from exporters.model import Quality  # noqa: E402
from exporters.gpu.nvml import NvmlSource  # noqa: E402
from timing import median_wall_cpu  # noqa: E402

GPUS, LINKS = 8, 18


def _serve(port_q: "multiprocessing.Queue[int]", personality: str) -> None:
    from aiohttp import web

    from sim.nvml_api import add_nvml_routes
    from sim.rack import RackModel

    model = RackModel(nodes=1, gpus_per_node=GPUS, nvlinks=LINKS, personality=personality)
    model.step(5.0)

    async def main() -> None:
        app = web.Application()
        add_nvml_routes(app, model)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_q.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        while True:
            await asyncio.sleep(3600)

    asyncio.run(main())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--personality", default="h100", help="h100 (legacy NVLink counters) or gb200 (NVLink5 fields)")
    args = ap.parse_args()
    q: multiprocessing.Queue[int] = multiprocessing.Queue()
    proc = multiprocessing.Process(target=_serve, args=(q, args.personality), daemon=True)
    proc.start()
    try:
        url = f"http://127.0.0.1:{q.get(timeout=30)}"
        twin = NvmlTwin(url, "node01")
        src = NvmlSource(twin, GPUS, LINKS, call_timeout=10.0, xid_events=False)
        first = asyncio.run(src.poll())  # warm-up: static facts, NotSupported answers
        result = [first]

        def cycle() -> None:
            result[0] = src._collect()  # the cycle itself, on this thread (what the driver thread runs)

        before = twin.requests
        wall, cpu = median_wall_cpu(cycle, args.runs)
        per_cycle = (twin.requests - before) / args.runs
        peer_wall, peer_cpu = median_wall_cpu(lambda: twin.nvmlDeviceGetCount(), args.runs)
        readings = result[0].readings
        ok = sum(1 for r in readings if r.quality is Quality.OK)
        print(f"nvml cycle, {GPUS} {args.personality} GPUs x {LINKS} NVLinks on the twin, median of {args.runs} runs")
        print(f"  cpu   {cpu * 1e3:7.2f} ms   (aim < 5 ms)")
        print(f"  wall  {wall * 1e3:7.2f} ms")
        print(f"  http requests per cycle  {per_cycle:.1f}")
        print(f"  series  {ok}   (unsupported marked once on the warm-up cycle: "
              f"{sum(1 for r in first.readings if r.quality is Quality.UNSUPPORTED)})")
        print(f"  peer: state fetch alone (1 HTTP GET + JSON)  cpu {peer_cpu * 1e3:.2f} ms  wall {peer_wall * 1e3:.2f} ms;"
              f" cycle/fetch cpu ratio {cpu / peer_cpu:.1f}x")
        asyncio.run(src.close())
    finally:
        proc.terminate()
        proc.join(5)


if __name__ == "__main__":
    main()
