"""The CPU sampler behind bench_overhead's profile (agent/cpu_profile.py): CPU burnt in a component's code is
charged to that component, on the main thread and on another one, and the window's total is the threads' CPU.

The work runs in functions compiled under a file name of the component (exporters/redfish/..., a thread's own
code under a neutral name), so the test needs no device: only the stack decides the component."""

from __future__ import annotations

import threading
import time

from agent.cpu_profile import CpuSampler

BURN = """
def burn(seconds):
    end = time.thread_time() + seconds
    n = 0
    while time.thread_time() < end:
        n += 1
    return n
"""


def _burner(path: str):
    scope = {"time": time}
    exec(compile(BURN, path, "exec"), scope)
    return scope["burn"]


def test_cpu_is_charged_to_the_component_whose_code_burnt_it_on_any_thread():
    redfish = _burner("/repo/exporters/redfish/poll_burn.py")
    plain = _burner("/repo/somewhere/else.py")
    sampler = CpuSampler(every_s=0.004)
    sampler.start()
    try:
        # The burn is measured by the thread's own clock, which also counts the sampler's handler running on this
        # thread (charged to no component, `own`) and the first interval before any sample: under load those
        # are tens of milliseconds. So burn in slices until the component holds 0.2 s, or give up at 1 s of CPU:
        # CPU charged anywhere else never gets there.
        burnt = 0.0
        while sampler.window.get("Redfish: polls", 0) < 0.2 and burnt < 1.0:
            redfish(0.05)
            burnt += 0.05
        done = threading.Event()
        worker = threading.Thread(target=lambda: (plain(0.25), done.wait(10)), name="nvml_3")
        worker.start()
        # Python runs signal handlers on the main thread only: the agent's event loop wakes for one (asyncio's
        # wakeup fd); here the main thread looks every 20 ms. The worker waits to be sampled once more before
        # it ends: a thread's CPU is read from its own clock, which ends with it.
        while sampler.window.get("thread nvml", 0) < 0.2 and worker.is_alive():
            worker.join(0.02)
        done.set()
        worker.join()
        window = sampler.take()
    finally:
        sampler.stop()
    comps = window["components"]
    assert window["samples"] >= 20
    assert comps.get("Redfish: polls", 0) >= 0.2, comps  # ... not the handler's own frame, nor "other"
    assert comps.get("other (main thread)", 0) < 0.1, comps  # the slices' seams only
    assert comps.get("thread nvml", 0) >= 0.2, comps  # another thread's CPU by its own clock, named by its thread
    assert sum(comps.values()) <= window["process_cpu_s"] + 0.01
    assert sampler.take()["components"] == {}  # a new window begins empty
