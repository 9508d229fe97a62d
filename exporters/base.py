"""The contract every collector meets, so the runtime can schedule any of them alike."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Protocol, TypeVar, runtime_checkable

from exporters.model import PollResult, SourceError

T = TypeVar("T")


@runtime_checkable
class Source(Protocol):
    """One device (or one local subsystem) polled on its own schedule.

    `name` is the source kind (`nvml`, `links`, `dom`, `cdu`, `leak`, `pdu`),
    `device` the instance (`gpu` host, a CDU name, a PDU name). `poll()`
    raises `SourceError` when the device as a whole could not be read; a
    partly readable device returns what it read with its qualities.
    """

    name: str
    device: str

    async def poll(self) -> PollResult: ...

    async def close(self) -> None: ...


class BlockingCaller:
    """Runs blocking driver calls on a thread of their own, so a hung call stalls nothing else.

    A hung NVML call cannot be cancelled; we give up waiting after the
    timeout (the source is then marked down) and refuse new calls until the
    hung one returns, instead of piling up threads behind a wedged driver.
    """

    def __init__(self, name: str):
        self._name = name
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._busy = threading.Event()

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    async def call(self, fn: Callable[..., T], *args: Any, timeout: float) -> T:
        if self._busy.is_set():
            raise SourceError("timeout", f"{self._name}: a previous driver call is still hung")

        def run() -> T:
            self._busy.set()
            try:
                return fn(*args)
            finally:
                self._busy.clear()

        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._executor, run)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            raise SourceError("timeout", f"{self._name}: driver call exceeded {timeout:.1f}s") from None

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
