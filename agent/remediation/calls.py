"""Blocking device calls (NVML, sysfs links, Modbus) on bounded pools of their own, each with a timeout.

Why not asyncio's default pool: a hung driver keeps its thread forever, and the default pool is
shared with DNS lookups and everything else `to_thread` runs; a few hung NVML calls there would
starve them all. Each family gets its own small pool, so a hung GPU driver can take at most that
pool's threads. A call still queued when its caller gave up is dropped, never run late (a power
cap applied minutes after its step failed would be an action nobody journaled).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from typing import Any, Callable


class DeviceCallTimeout(TimeoutError):
    """A device call did not answer within its budget (the driver or device may be hung)."""


class DeviceCalls:
    def __init__(self, name: str, workers: int = 4, timeout: float = 5.0):
        self.name = name
        self.timeout = timeout
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"calls-{name}")

    async def __call__(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kw: Any) -> Any:
        """fn(*args) with a timeout: coroutines awaited, blocking functions on this family's pool."""
        budget = self.timeout if timeout is None else timeout
        what = getattr(fn, "__name__", repr(fn))
        if inspect.iscoroutinefunction(fn):
            try:
                return await asyncio.wait_for(fn(*args, **kw), budget)
            except asyncio.TimeoutError:
                raise DeviceCallTimeout(f"{self.name}: {what} did not answer within {budget}s") from None
        given_up = threading.Event()

        def guarded() -> Any:
            if given_up.is_set():
                return None  # the caller timed out while this waited for a thread: never act late
            return fn(*args, **kw)

        fut = asyncio.get_running_loop().run_in_executor(self._pool, guarded)
        try:
            result = await asyncio.wait_for(fut, budget)
        except asyncio.TimeoutError:
            given_up.set()
            raise DeviceCallTimeout(f"{self.name}: {what} did not answer within {budget}s") from None
        if inspect.isawaitable(result):  # a plain function (lambda) returning a coroutine
            try:
                result = await asyncio.wait_for(result, budget)
            except asyncio.TimeoutError:
                raise DeviceCallTimeout(f"{self.name}: {what} did not answer within {budget}s") from None
        return result


# One pool per device family for the whole process (threads stuck in a hung driver cannot be killed,
# so a pool per engine would leak them on every reload).
NVML = DeviceCalls("nvml", workers=4)
DEVICES = DeviceCalls("devices", workers=4)
