"""A BACnet/IP device of another stack than the agent's (legacy BACpypes, sim/bacnet_device.py) for tests.

The device process lives on an event loop of its own in a thread, so one device serves a whole test module
(module-scoped fixtures) while each test runs its own `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from sim.bacnet_process import BacnetDeviceProcess


class ThreadedDevice:
    def __init__(self, profile: str, **kw: Any):
        self.loop = asyncio.new_event_loop()
        self._writes: list[tuple[str, Any]] = []
        self.dev = BacnetDeviceProcess(profile, on_write=lambda p, v: self._writes.append((p, v)), **kw)
        self._thread = threading.Thread(target=self.loop.run_forever, name="bacnet-device", daemon=True)

    def _run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> "ThreadedDevice":
        self._thread.start()
        self._run(self.dev.start())
        return self

    @property
    def endpoint(self) -> tuple[str, int]:
        return self.dev.endpoint

    def command(self, **msg: Any) -> None:
        self._run(self.dev.command(msg))
        assert not self.dev.errors, self.dev.errors

    @property
    def writes(self) -> list[tuple[str, Any]]:
        """Every client write the device reported so far, (point, present value), in order. A round trip first:
        the device reports a write on its stdout while it serves it, and our reader thread may not have read that
        line yet when the client already has its answer; lines are read in order, so after the round trip's ack
        every earlier write is in."""
        self.stats()
        return list(self._writes)

    def stats(self) -> dict[str, int]:
        return self._run(self.dev.stats())

    def stop(self) -> None:
        try:
            self._run(self.dev.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


@contextmanager
def bacnet_device(profile: str, **kw: Any) -> Iterator[ThreadedDevice]:
    dev = ThreadedDevice(profile, **kw).start()
    try:
        yield dev
    finally:
        dev.stop()
