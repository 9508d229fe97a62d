"""A simulated rack running in a background thread of the caller's process (its own event loop): the rack the
tests and benches run real agents against, and inject faults into directly (`SimRack.inject`, the model itself).

Why in the simulator: it is the simulator's own factory of a rack (issue 32), the one the suite, the benches
and anything else embedding the simulator share; the agent's package never needs it."""

from __future__ import annotations

import asyncio
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from sim.server import Simulator


class SimRack:
    def __init__(self, workdir: Path, **kwargs: Any):
        os.environ.setdefault("SUPERNODE_SIM_FILE", str(workdir / "sim.json"))
        self.sim = Simulator(workdir=workdir / "sim", advertise=False, **kwargs)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="simrack", daemon=True)

    def start(self) -> "SimRack":
        self._thread.start()
        self.call(self.sim.start())
        return self

    def call(self, coro: Any, timeout: float = 20.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def inject(self, kind: str, **params: Any) -> str:
        async def run() -> str:
            return self.sim.inject(kind, params)
        return self.call(run())

    def clear(self) -> None:
        async def run() -> None:
            self.sim.clear()
        self.call(run())

    @property
    def url(self) -> str:
        return self.sim.url

    @property
    def gpu_reset_command(self) -> list[str]:
        """What an agent of this rack runs to reset a GPU (its `remediation.gpu_recovery.gpu_reset_command`)."""
        from sim.cli import gpu_reset_command

        return gpu_reset_command(self.sim.url)

    def stop(self) -> None:
        try:
            self.call(self.sim.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)


@contextmanager
def sim_rack(workdir: Path, **kwargs: Any) -> Iterator[SimRack]:
    rack = SimRack(workdir, **kwargs).start()
    try:
        yield rack
    finally:
        rack.stop()
