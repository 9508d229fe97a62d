"""The contract every collector meets, so the runtime can schedule any of them alike."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Hashable, Protocol, TypeVar, runtime_checkable

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
            async with asyncio.timeout(timeout):
                return await asyncio.shield(fut)
        except asyncio.TimeoutError:
            raise SourceError("timeout", f"{self._name}: driver call exceeded {timeout:.1f}s") from None

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class HeldCounters:
    """Which devices (GPUs, ports) read their error counters this cycle, and what to give between reads.

    Error counters change rarely and can be costly to read (an NVML batch of ~1,000 fields on a GB200 node, a
    firmware query per file on an HCA), so a device reads them every `every` cycles and, in between, gives its
    last read's readings again with their own timestamps: a rate is never taken over a sample read twice. A
    device that missed a cycle (lost, hung, absent, renumbered, or the whole poll failed) reads them again at
    once, so counters from before a reset or a swap are never given as its current ones.
    """

    def __init__(self, every: int):
        self.every = max(1, every)
        self._held: dict[Hashable, tuple[int, int, list[Any]]] = {}  # key -> (last cycle read, cycle due, readings)

    def due(self, key: Hashable, cycle: int) -> bool:
        held = self._held.get(key)
        return held is None or held[0] != cycle - 1 or cycle >= held[1]

    def read(self, key: Hashable, cycle: int, readings: list[Any]) -> None:
        """The device read its counters in `cycle`: these readings stand until its next read."""
        self._held[key] = (cycle, cycle + self.every, readings)

    def again(self, key: Hashable, cycle: int) -> list[Any]:
        """The device was read in `cycle` without its counters (not `due`): the readings of their last read."""
        _, due, readings = self._held[key]
        self._held[key] = (cycle, due, readings)
        return readings

    def forget(self, key: Hashable) -> None:
        """The device could not be read: its next read reads the counters."""
        self._held.pop(key, None)


class EventStream:
    """Readings a source publishes from its own thread as events happen, outside its poll cycle.

    Why: an event (an XID) must reach the detectors within one event wait,
    even while the poll cycle is slow or hung. The runtime attaches a sink
    that hands the readings to its event loop thread-safely and registers
    `name`/`device` as a store entry of its own; until one is attached (a
    one-shot probe, a bare test) `publish` returns False and the source
    keeps such readings in its poll result instead.

    Between events the readings do not change: `keepalive` then says the
    stream is alive (its entry stays fresh) without publishing them again,
    so the detectors are not run on the same readings every `every` seconds.
    """

    def __init__(self, name: str, device: str):
        self.name = name
        self.device = device
        self.every = 5.0  # say so at least this often, so the entry stays fresh without events
        self._sink: Callable[[list[Any]], None] | None = None
        self._fail: Callable[[str, str], None] | None = None
        self._alive: Callable[[], None] | None = None

    @property
    def attached(self) -> bool:
        return self._sink is not None

    def attach(self, sink: Callable[[list[Any]], None], every: float,
               fail: Callable[[str, str], None] | None = None, alive: Callable[[], None] | None = None) -> None:
        self.every = every
        self._fail = fail
        self._alive = alive
        self._sink = sink

    def detach(self) -> None:
        self._sink = self._fail = self._alive = None

    def publish(self, readings: list[Any]) -> bool:
        return self._send(self._sink, readings)

    def keepalive(self, readings: list[Any]) -> bool:
        """The stream is alive and its last published readings still hold (publishes them if no `alive` sink)."""
        if self._alive is None:
            return self.publish(readings)
        return self._send(self._alive)

    def fail(self, kind: str, message: str) -> bool:
        """The stream cannot run (e.g. events unsupported): its entry reads down, with why."""
        return self._send(self._fail, kind, message)

    @staticmethod
    def _send(fn: Callable[..., None] | None, *args: Any) -> bool:
        if fn is None:
            return False
        try:
            fn(*args)
        except RuntimeError:  # the event loop has closed under us (shutdown)
            return False
        return True


async def off_loop(fn: Callable[[], Any], timeout: float, name: str) -> bool:
    """Run a blocking call on a thread of its own and wait at most `timeout`; False if it did not return.

    For driver calls at close or reload (nvmlShutdown, nvmlInit) that must
    never block the event loop, nor sit in asyncio's shared default pool if
    they hang.
    """
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def finished() -> None:
        if not done.done():
            done.set_result(None)

    def run() -> None:
        try:
            fn()
        finally:
            try:
                loop.call_soon_threadsafe(finished)
            except RuntimeError:  # loop closed: nobody waits any more
                pass

    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        async with asyncio.timeout(timeout):
            await done
    except asyncio.TimeoutError:
        return False
    return True


class PollTrigger:
    """Lets a source ask for a poll of itself now, outside its timer (an event said something changed).

    Why a holder and not a callback argument: the source is built before the
    runtime schedules it. The runtime attaches a function that polls the source
    at once, or right after the poll in progress; until then (a probe, a bare
    test) `fire` returns False and the timer alone polls.
    """

    def __init__(self) -> None:
        self._fn: Callable[[], Any] | None = None

    def attach(self, fn: Callable[[], Any]) -> None:
        self._fn = fn

    def detach(self) -> None:
        self._fn = None

    def fire(self) -> bool:
        if self._fn is None:
            return False
        self._fn()
        return True
