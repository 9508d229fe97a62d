"""Blocking device calls (NVML, sysfs links, Modbus) on bounded pools of their own, each with a timeout.

Why not asyncio's default pool: a hung driver keeps its thread forever, and the default pool is
shared with DNS lookups and everything else `to_thread` runs; a few hung NVML calls there would
starve them all. Each family gets its own small pool, so a hung GPU driver can take at most that
pool's threads. A call still queued when its caller gave up is dropped, never run late (a power
cap applied minutes after its step failed would be an action nobody journaled). And a device
whose earlier call is still stuck in the driver (`key`: one GPU) is refused at once instead of
tying up another thread: one hung GPU holds one thread, and the others keep the rest of the pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from typing import Any, Callable, Hashable


class DeviceCallTimeout(TimeoutError):
    """A device call did not answer within its budget (the driver or device may be hung)."""


class DeviceCalls:
    def __init__(self, name: str, workers: int = 4, timeout: float = 5.0):
        self.name = name
        self.timeout = timeout
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"calls-{name}")
        self._lock = threading.Lock()
        self._stuck: dict[Hashable, int] = {}  # key -> calls past their budget still inside the driver

    def stuck(self, key: Hashable) -> bool:
        with self._lock:
            return self._stuck.get(key, 0) > 0

    async def __call__(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None,
                       key: Hashable | None = None, **kw: Any) -> Any:
        """fn(*args) with a timeout: coroutines awaited, blocking functions on this family's pool.

        `key` names the device: while an earlier call on it is stuck past its budget, new ones fail at once.
        """
        budget = self.timeout if timeout is None else timeout
        what = getattr(fn, "__name__", repr(fn))
        if key is not None and self.stuck(key):
            raise DeviceCallTimeout(f"{self.name}: {what}: {key} still hung in an earlier call")
        if inspect.iscoroutinefunction(fn):
            try:
                async with asyncio.timeout(budget):
                    return await fn(*args, **kw)
            except asyncio.TimeoutError:
                raise DeviceCallTimeout(f"{self.name}: {what} did not answer within {budget}s") from None
        given_up, started, finished = threading.Event(), threading.Event(), threading.Event()
        marked = [False]

        def guarded() -> Any:
            with self._lock:
                if given_up.is_set():
                    return None  # the caller timed out while this waited for a thread: never act late
                started.set()
            try:
                return fn(*args, **kw)
            finally:
                with self._lock:
                    finished.set()
                    if marked[0]:
                        self._stuck[key] -= 1
                        if not self._stuck[key]:
                            del self._stuck[key]

        fut = asyncio.get_running_loop().run_in_executor(self._pool, guarded)
        try:
            async with asyncio.timeout(budget):
                result = await fut
        except asyncio.TimeoutError:
            with self._lock:
                given_up.set()
                if key is not None and started.is_set() and not finished.is_set():
                    marked[0] = True
                    self._stuck[key] = self._stuck.get(key, 0) + 1
            raise DeviceCallTimeout(f"{self.name}: {what} did not answer within {budget}s") from None
        if inspect.isawaitable(result):  # a plain function (lambda) returning a coroutine
            try:
                async with asyncio.timeout(budget):
                    result = await result
            except asyncio.TimeoutError:
                raise DeviceCallTimeout(f"{self.name}: {what} did not answer within {budget}s") from None
        return result


# One pool per device family for the whole process (threads stuck in a hung driver cannot be killed,
# so a pool per engine would leak them on every reload).
NVML = DeviceCalls("nvml", workers=4)
DEVICES = DeviceCalls("devices", workers=4)
