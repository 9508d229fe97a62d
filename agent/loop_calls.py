"""Handing a callback to an asyncio loop from code that may or may not run on that loop's own thread.

Why: `call_soon_threadsafe` writes to the loop's self-pipe, which costs one more wake-up of the loop and two
system calls; called from the loop's own thread, `call_soon` does the same job without them. The snapshot store's
listeners and apscheduler's wake-ups are called from either (a source's poll on the loop, a driver thread).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable


def running_on(loop: asyncio.AbstractEventLoop) -> bool:
    """Is the caller running on `loop` (its own thread, inside it)?"""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def call_soon_from_anywhere(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> None:
    """`loop.call_soon` on the loop's own thread, `call_soon_threadsafe` from any other."""
    if running_on(loop):
        loop.call_soon(callback, *args)
    else:
        loop.call_soon_threadsafe(callback, *args)
