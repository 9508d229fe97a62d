"""The wake-up floor: what this machine charges a Python process for being woken, with nothing else to do.

Why it is measured: on a virtual machine a wake-up from idle costs far more than on bare metal (the
vCPU halted, caches cold when it resumes), and an agent that polls many small devices every second is
woken tens of times a second: by its timers, by each device's reply, by its driver threads handing
work back. bench_overhead counts the agent's wake-ups (voluntary context switches of all its threads)
in its windows and runs this peer, a bare process woken as often, in the same run, so the agent's CPU
can be read against what the machine charges before any work is done.

The peer wakes the way the agent does: an asyncio loop on its main thread (the agent's loop, woken by
timers and sockets) and one plain thread waiting on an Event with a timeout (the agent's driver and
event threads, woken through futexes).

    python bench/wake_floor.py LOOP_WAKES_PER_S THREAD_WAKES_PER_S SECONDS   # prints its CPU, % of a core
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple


class Switches(NamedTuple):
    """A process's context switches so far. A voluntary switch is a thread going to sleep, so each is one
    wake-up to come; an involuntary one is a running thread preempted, not a wake-up, and is kept apart."""

    loop: int  # voluntary, the main thread's (the agent's event loop)
    threads: int  # voluntary, all its other threads'
    preempted: int  # involuntary, all threads


def context_switches(pid: int) -> Switches:
    loop = threads = preempted = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                if int(tid) == pid:
                    loop += int(line.split()[1])
                else:
                    threads += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                preempted += int(line.split()[1])
    return Switches(loop, threads, preempted)


def floor_percent(loop_per_s: float, thread_per_s: float, seconds: float, env: dict[str, str] | None = None) -> float:
    """The peer's CPU, % of one core, run as its own process with this interpreter (and `env`)."""
    out = subprocess.run([sys.executable, __file__, f"{loop_per_s:.3f}", f"{thread_per_s:.3f}", f"{seconds:g}"],
                         capture_output=True, text=True, check=True, env=env, timeout=seconds + 30)
    return float(out.stdout.strip())


def _peer(loop_per_s: float, thread_per_s: float, seconds: float) -> float:
    stop = threading.Event()

    def waker() -> None:
        gap = 1.0 / thread_per_s
        while not stop.wait(gap):
            pass

    async def run() -> float:
        if thread_per_s > 0:
            threading.Thread(target=waker, daemon=True).start()
        gap = 1.0 / loop_per_s if loop_per_s > 0 else seconds
        c0, t0 = time.process_time(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(gap)
        stop.set()
        return 100 * (time.process_time() - c0) / (time.monotonic() - t0)

    return asyncio.run(run())


if __name__ == "__main__":
    loop_rate, thread_rate, span = (float(a) for a in sys.argv[1:4])
    print(f"{_peer(loop_rate, thread_rate, span):.3f}")
