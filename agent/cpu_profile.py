"""Where the agent's CPU goes, by component: a sampler driven by the CPU the process uses, off unless asked for.

Why in the process and driven by its CPU: the agent spends about 1 % of a core, mostly in short bursts on its
event loop. A sampler outside it (py-spy) sees a thread that woke from epoll but waits for a core on a loaded
machine as busy, and one woken at a fixed rate would cost more than what it measures. Here the kernel's
profiling timer (ITIMER_PROF: it runs only while the process uses CPU) raises SIGPROF every `every_s` of that
CPU (at the kernel's tick at best, 4 ms here), so an idle agent is never woken and one burning CPU is sampled
in proportion. At each sample every thread's CPU since the last one (its own CPU clock, so the totals are
exact) is charged to the component its stack is in now; only the split between components is sampled.

Components are named by the code on the stack (`RULES`, the first rule matching any frame of it wins, most
specific first), so the etcd client's TLS read for a lease keep-alive counts as the keep-alive. Work done in
asyncio's transport callbacks (a TLS record decrypted as it arrives) has no caller of ours on its stack and
counts as "TLS and HTTP I/O"; the loop's own wake-ups and dispatch as "event loop".

Enabled by SUPERNODE_CPU_PROFILE=<file> in the daemon's environment (bench/bench_overhead.py sets it): each
SIGUSR2 writes the components' CPU seconds since the previous SIGUSR2 (or the start) to that file as JSON and
starts a new window. Unset, nothing here runs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

ENV = "SUPERNODE_CPU_PROFILE"

# (component, path fragment of the code's file, function names or None for any): the first rule that matches
# any frame of a stack names its component. Paths use "/" (the file names of this repository's modules).
RULES: tuple[tuple[str, str, frozenset[str] | None], ...] = (
    ("facts: encode, decode, checks", "agent/coordination/facts.py", None),
    ("facts: encode, decode, checks", "agent/coordination/exchange.py", None),
    ("etcd: lease keep-alive", "agent/coordination/etcd_rack.py", frozenset({"_keepalive"})),
    ("etcd: fact puts", "agent/coordination/etcd_rack.py", frozenset({"_put_facts"})),
    ("etcd: watch", "agent/coordination/etcd_rack.py", frozenset({"_watch", "_apply", "_fact", "_load"})),
    ("etcd: watch", "agent/coordination/etcd.py", frozenset({"watch", "_watch_events", "_read_or_moved"})),
    ("etcd: leader, slots, links", "agent/coordination/", None),
    ("Redfish: event stream (SSE)", "exporters/redfish/events.py", None),
    ("Redfish: event stream (SSE)", "exporters/redfish/client.py", frozenset({"events"})),
    ("Redfish: sessions (login)", "exporters/redfish/client.py",
     frozenset({"_login", "login", "_session", "_ensure_session", "logout", "_logout"})),
    ("Redfish: polls", "exporters/redfish/", None),
    ("NVML", "exporters/gpu/", None),
    ("Modbus", "exporters/cooling/", None),
    ("SNMP", "exporters/power/", None),
    ("links and optics", "exporters/links/", None),
    ("detectors and remediation", "agent/remediation/", None),
    ("derived sources", "agent/derived", None),
    ("derived sources", "agent/thermal_baseline.py", None),
    ("snapshot store", "agent/snapshot.py", None),
    ("/metrics and status page", "agent/exposition.py", None),
    ("/metrics and status page", "agent/status/", None),
    ("/metrics and status page", "prometheus_client/", None),
    ("timers and poll tasks", "apscheduler/", None),
    ("timers and poll tasks", "agent/runtime.py", None),
    ("TLS and HTTP I/O", "/ssl.py", None),
    ("TLS and HTTP I/O", "asyncio/sslproto.py", None),
    ("TLS and HTTP I/O", "aiohttp/", None),
    ("event loop", "asyncio/", None),
    ("event loop", "/selectors.py", None),
)
NO_RULE = len(RULES)


def _rule_of(code: CodeType) -> int:
    path = code.co_filename.replace("\\", "/")
    for i, (_, fragment, names) in enumerate(RULES):
        if fragment in path and (names is None or code.co_name in names):
            return i
    return NO_RULE


class CpuSampler:
    """SIGPROF every `every_s` of the process's CPU; per window, CPU seconds by component (see the module doc)."""

    def __init__(self, every_s: float = 0.004):
        self.every_s = every_s
        # id(code) -> (code, its rule index): a stack is ~30 frames, so each code object is classified once. By
        # identity: code objects compare equal across files (the same function body compiled twice).
        self._rules: dict[int, tuple[CodeType, int]] = {}
        self._clocks: dict[int, int] = {}  # thread ident -> its CPU clock id
        self._last: dict[int, float] = {}  # thread ident -> its CPU seconds at the last sample
        self._names: dict[int, str] = {}
        self.window = Counter[str]()
        self.leaves = Counter[str]()  # each sample's innermost frame of the agent's own code, for a closer look
        self.samples = 0
        self.own = 0.0  # CPU seconds spent in the sampler itself (charged to no component)
        self.started = (time.monotonic(), time.process_time())
        self._previous: Any = None

    def start(self) -> None:
        self._previous = signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, self.every_s, self.every_s)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        if self._previous is not None:
            signal.signal(signal.SIGPROF, self._previous)

    def _component(self, frame: FrameType | None) -> tuple[str | None, str]:
        best, leaf, where = NO_RULE, "", ""
        rules = self._rules
        while frame is not None:
            code = frame.f_code
            if not leaf and ("/agent/" in code.co_filename or "/exporters/" in code.co_filename):
                leaf = f"{code.co_name} ({Path(code.co_filename).name}:{frame.f_lineno})"
            known = rules.get(id(code))
            if known is not None and known[0] is code:
                rule = known[1]
            else:
                rule = _rule_of(code)
                rules[id(code)] = (code, rule)
            if rule < best or (rule == best and rule < NO_RULE):  # the outermost frame of the winning rule
                best, where = rule, code.co_name
            frame = frame.f_back
        leaf = leaf or "(no frame of the agent's own)"
        return (RULES[best][0] if best < NO_RULE else None), (f"{where} > {leaf}" if where else leaf)

    def _thread_cpu(self, ident: int) -> float | None:
        clock = self._clocks.get(ident)
        try:
            if clock is None:
                clock = self._clocks[ident] = time.pthread_getcpuclockid(ident)
            return time.clock_gettime(clock)
        except (OSError, OverflowError):  # a thread that ended meanwhile
            self._clocks.pop(ident, None)
            return None

    def _sample(self, signum: int, frame: FrameType | None) -> None:
        entered = time.thread_time()
        self.samples += 1
        main = threading.main_thread().ident
        frames = sys._current_frames()
        if main is not None:
            frames[main] = frame  # not this handler's own frame: the code it interrupted
        for ident, top in frames.items():
            cpu = self._thread_cpu(ident)
            if cpu is None:
                continue
            spent = cpu - self._last.get(ident, cpu)
            self._last[ident] = cpu
            if spent <= 0:
                continue
            component, leaf = self._component(top)
            if component is None:
                component = f"thread {self._thread_name(ident)}" if ident != main else "other (main thread)"
            self.window[component] += spent
            self.leaves[leaf] += spent
        left = time.thread_time()
        self.own += left - entered
        if main is not None and main in self._last:  # the handler runs on the main thread: its cost is its own
            self._last[main] = left

    def _thread_name(self, ident: int) -> str:
        name = self._names.get(ident)
        if name is None:
            thread = threading._active.get(ident)  # type: ignore[attr-defined]
            name = self._names[ident] = (thread.name.rstrip("0123456789_-") or "unnamed") if thread else "unnamed"
        return name

    def take(self) -> dict[str, Any]:
        """The window since the last `take` (or the start), and a new one begun: components' CPU seconds, the
        process's own CPU over the same span (what no Python thread was charged with: threads that ended, C
        threads), the wall span and the samples taken."""
        now, cpu = time.monotonic(), time.process_time()
        t0, c0 = self.started
        out = {"wall_s": now - t0, "process_cpu_s": cpu - c0, "samples": self.samples, "sampler_cpu_s": self.own,
               "components": dict(self.window.most_common()),
               "leaves": dict(self.leaves.most_common(40))}
        self.window, self.leaves, self.samples, self.own, self.started = Counter(), Counter(), 0, 0.0, (now, cpu)
        return out


def install(loop: Any, environ: dict[str, str] | os._Environ = os.environ) -> CpuSampler | None:
    """Start the sampler when SUPERNODE_CPU_PROFILE names a file; SIGUSR2 writes a window to it. None when unset."""
    target = environ.get(ENV)
    if not target:
        return None
    sampler = CpuSampler()

    def dump() -> None:
        window = sampler.take()
        tmp = Path(f"{target}.tmp")
        tmp.write_text(json.dumps(window, indent=1))
        tmp.replace(target)  # whole or not at all: the reader polls for it

    loop.add_signal_handler(signal.SIGUSR2, dump)
    sampler.start()
    return sampler
