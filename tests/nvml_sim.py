"""Test fixture: a RackModel behind the real NVML HTTP routes, on 127.0.0.1, in a background loop.

The NVML twin under test then talks to a real HTTP server in this process,
as the agent talks to the simulator process in production.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Iterator

from aiohttp import web

from sim.nvml_api import add_nvml_routes
from sim.rack import RackModel
from tests.helpers import free_port


class NvmlSimServer:
    """Serves `model` on a free port; `url` is what NvmlTwin takes; `middlewares` may watch or hold requests."""

    def __init__(self, model: RackModel, middlewares: tuple = ()):
        self.model = model
        self.middlewares = tuple(middlewares)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="nvml-sim", daemon=True)
        self._runner: web.AppRunner | None = None

    def start(self) -> "NvmlSimServer":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        app = web.Application(middlewares=list(self.middlewares))
        add_nvml_routes(app, self.model)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def serve(model: RackModel) -> Iterator[NvmlSimServer]:
    """Generator body for a pytest fixture."""
    srv = NvmlSimServer(model).start()
    try:
        yield srv
    finally:
        srv.stop()
