"""Benchmark: one poll of the reference CDU plus an RLE LD2100 leak controller.

Prints requests per poll (against the number of contiguous blocks the
register maps need), wall and CPU time of a poll (median of N), and the same
registers read by `mbpoll` (one invocation per block, as an operator would)
in the same run, with the ratio. The simulated devices run in a child
process so their CPU time is not counted as the collector's.

    .venv/bin/python bench/bench_modbus.py [--runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporters.cooling.modbus import ModbusSource  # noqa: E402
from exporters.cooling.modbus_profile import load_profile, plan_blocks  # noqa: E402
from sim.ports import free_port  # noqa: E402

DEVICES = (("cdu", "reference-cdu"), ("leak", "rle-ld2100"))
MBPOLL_TABLE = {"coil": "0", "discrete": "1", "holding": "4", "input": "3"}


async def serve(ports: list[int]) -> None:
    from sim.modbus_devices import SimModbusDevice
    from sim.rack import RackModel

    model = RackModel(leak_zones={"zone-a": ["node01"], "zone-b": ["node02"]})
    devs = [SimModbusDevice(name, model, profile, port) for (name, profile), port in zip(DEVICES, ports)]
    for d in devs:
        await d.start()
    print("ready", flush=True)
    while True:
        with model.lock:
            model.step(0.1)
            for d in devs:
                d.update(model)
        await asyncio.sleep(0.1)


async def bench_collector(ports: list[int], runs: int) -> tuple[list[float], list[float], int]:
    sources = [ModbusSource(kind, kind, profile, "127.0.0.1", port, timeout=2.0)
               for (kind, profile), port in zip(DEVICES, ports)]
    for s in sources:  # connect and warm up
        await s.poll()
    walls, cpus = [], []
    before = sum(s.stats.requests for s in sources)
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        for s in sources:
            await s.poll()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    requests = (sum(s.stats.requests for s in sources) - before) // runs
    for s in sources:
        await s.close()
    return walls, cpus, requests


def bench_mbpoll(mbpoll: str, ports: list[int], runs: int) -> tuple[list[float], list[float]]:
    cmds = []
    for (_, profile), port in zip(DEVICES, ports):
        p = load_profile(profile)
        for b in plan_blocks(p):
            cmds.append([mbpoll, "-m", "tcp", "-p", str(port), "-a", str(p.device.unit), "-t", MBPOLL_TABLE[b.table],
                         "-r", str(b.start), "-0", "-c", str(b.count), "-1", "-q", "127.0.0.1"])
    walls, cpus = [], []
    for _ in range(runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        for cmd in cmds:
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        walls.append(time.perf_counter() - w0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
    return walls, cpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--serve", nargs="*", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    ports = [free_port() for _ in DEVICES]
    child = subprocess.Popen([sys.executable, __file__, "--serve", *map(str, ports)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        blocks = sum(len(plan_blocks(load_profile(p))) for _, p in DEVICES)
        walls, cpus, requests = asyncio.run(bench_collector(ports, args.runs))
        med = statistics.median
        print(f"profiles: {', '.join(p for _, p in DEVICES)}")
        print(f"requests per poll: {requests} (contiguous blocks in the maps: {blocks})")
        print(f"collector: wall {med(walls) * 1e3:.2f} ms, cpu {med(cpus) * 1e3:.2f} ms (median of {args.runs})")
        mbpoll = shutil.which("mbpoll")
        if mbpoll is None:
            print("mbpoll: not installed (apt-get install mbpoll); no ratio")
            return
        mw, mc = bench_mbpoll(mbpoll, ports, args.runs)
        print(f"mbpoll ({blocks} invocations, same registers): wall {med(mw) * 1e3:.2f} ms, "
              f"cpu {med(mc) * 1e3:.2f} ms (median of {args.runs})")
        print(f"ratio collector/mbpoll: wall {med(walls) / med(mw):.2f}x, cpu {med(cpus) / med(mc):.2f}x")
    finally:
        child.terminate()
        child.wait(5)


if __name__ == "__main__":
    main()
