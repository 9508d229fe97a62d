"""The simulator in a test's own process, on its own event loop in a background thread.

Why a thread: in production the simulator is a separate process; a test that needs its HTTP API (faults,
NVML twin routes) and synchronous peers (Slurm, agent processes) at once runs it beside them this way.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from typing import Any

from sim.server import Simulator


class SimThread:
    """The simulator on its own event loop in a background thread (it is a separate process in production)."""

    def __init__(self, sim: Simulator):
        self.sim = sim
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="simulator", daemon=True)

    def start(self) -> str:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self.sim.start(), self.loop).result(30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.sim.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """The simulator's HTTP injection API, as `supernode-sim inject/clear` calls it."""
        req = urllib.request.Request(self.sim.url + path, data=json.dumps(body or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.load(resp)
