"""Cold-plate fouling onset -> the cold_plate_degraded warning (issue 35), against the time the same GPU would take
to reach its slowdown temperature, in the same run.

One real agent (node01 of a 2-tray GB200 simulated rack: the NVML twin, the Modbus CDU) with the demo's cold-plate
settings (sim/demo.py demo_cold_plates: R every 2 s, settle and smoothing 10 s, cold_plate_degraded held 30 s).
Each run fouls one GPU's plate progressively from its onset at BENCH_RAMP %/s (default 1 %/s: a fast ramp, so a
run takes about a minute; a real plate fouls over days, where the hold times vanish against the ramp and the
warning leads by far more) and records two times from the onset:
- the warning: the agent's cold_plate_degraded incident for that GPU opening (its journal's opened_at);
- the named peer: the simulator's GPU temperature reaching its slowdown threshold, which is what an operator
  without this detector waits for (the first throttle, and gpu_thermal's cap).
RUNS runs (default 5; BENCH_RUNS), each on the next GPU, each after `clear` and every incident closed. Prints the
median and p99 of both and the ratio of the medians.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from sim.demo import demo_cold_plates  # noqa: E402
from sim.harness import SimRack  # noqa: E402
from tests.agentproc import AgentProcess  # noqa: E402
from tests.helpers import wait_for  # noqa: E402
from tests.test_detectors_agent import _config, _incidents  # noqa: E402
from timing import machine_reference, percentiles  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "5"))
RAMP = float(os.environ.get("BENCH_RAMP", "1.0"))  # % of the plate's clean resistance per second


def _open(agent: AgentProcess, detector: str) -> list[dict]:
    return [i for i in _incidents(agent)["open"] if i["detector"] == detector]


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="bench-cooling-"))
    rack = SimRack(base, nodes=2, gpus=4, personality="gb200").start()
    warned, throttled, temps = [], [], []
    try:
        cfg = _config(rack, base)
        demo_cold_plates(cfg)
        agent = AgentProcess(cfg, base).start()
        try:
            model = rack.sim.model
            gpus = model.nodes["node01"].gpus
            # Every GPU's baseline learnt on its clean plate before the first onset (the demo learns for 60 s).
            wait_for(lambda: agent.metrics().count("supernode_gpu_thermal_resistance_baseline_kelvin_per_watt{")
                     == len(gpus), 300, interval=0.5, what="every GPU's baseline learnt")
            for run in range(RUNS):
                g = gpus[run % len(gpus)]
                rack.clear()
                try:
                    wait_for(lambda: not _open(agent, "cold_plate_degraded") and not _open(agent, "gpu_thermal"),
                             300, interval=0.5, what="every incident closed before the run")
                except AssertionError:
                    print(f"still open: {_incidents(agent)['open']}\n{agent.metrics()}", file=sys.stderr)
                    raise
                wait_for(lambda: g.power_limit_mw == g.default_limit_mw, 120, interval=0.5, what="caps undone")
                time.sleep(15)  # the smoothed R back at the clean plate's (smoothing 10 s) before the next onset
                t0, warn, slow, temp = time.time(), None, None, None
                while warn is None or slow is None:
                    now = time.time()
                    if now - t0 > 600:
                        raise TimeoutError(f"run {run}: warning {warn}, slowdown {slow}")
                    rack.inject("cold-plate-fouling", node="node01", gpu=g.index, percent=RAMP * (now - t0))
                    with model.lock:
                        hot = g.temp_c >= g.slowdown_c
                    if slow is None and hot:
                        slow = now - t0
                    if warn is None:
                        inc = [i for i in _open(agent, "cold_plate_degraded")
                               if i["targets"].get("gpu") == str(g.index)]
                        if inc:
                            warn, temp = inc[0]["opened_at"] - t0, inc[0]["detail"].get("temperature_celsius")
                    time.sleep(0.25)
                warned.append(warn)
                throttled.append(slow)
                temps.append((temp, g.slowdown_c))
                print(f"run {run} gpu {g.index}: warning after {warn:.1f} s at {temp} C, slowdown "
                      f"{g.slowdown_c} C reached after {slow:.1f} s", file=sys.stderr)
        finally:
            agent.stop()
    finally:
        rack.stop()
    w50, w99 = percentiles(warned)
    s50, s99 = percentiles(throttled)
    print(f"cold-plate fouling ramp {RAMP:g} %/s -> cold_plate_degraded (demo holds), {RUNS} runs: p50 {w50:.1f} s, "
          f"p99 {w99:.1f} s; the same GPU reaching its slowdown temperature (the peer): p50 {s50:.1f} s, p99 "
          f"{s99:.1f} s; warning/slowdown {w50 / s50:.2f}x, lead {s50 - w50:.1f} s; temperature at the warning "
          f"{', '.join(f'{t:.0f}/{s} C' for t, s in temps)}")
    print(machine_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
