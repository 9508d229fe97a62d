"""Test utilities: condition waits with deadlines, free ports, real-peer checks."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Awaitable, Callable, TypeVar

import pytest

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def wait_for(cond: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> T:
    """Poll `cond` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


async def await_for(cond: Callable[[], T | Awaitable[T]], timeout: float = 10.0, interval: float = 0.02,
                    what: str = "condition") -> T:
    """Async twin of `wait_for`; `cond` may be a coroutine function."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_binary(name: str) -> str:
    """Path of a real peer's binary. Missing: fail in CI (make test installs it), skip elsewhere."""
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None)
    if path:
        return path
    if IN_CI:
        pytest.fail(f"real peer {name!r} is not installed (make test installs it)")
    pytest.skip(f"{name} not installed")


def shared_data(relpath: str) -> Path:
    """A file of ../shared/data, read in place. Missing: fail in CI, skip elsewhere."""
    path = SHARED_DATA / relpath
    if path.exists():
        return path
    if IN_CI:
        pytest.fail(f"shared data {path} is missing")
    pytest.skip(f"shared data {path} not found")
