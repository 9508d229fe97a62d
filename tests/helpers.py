"""Test utilities: condition waits with deadlines, free ports, real-peer checks."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable, TypeVar

import pytest

from sim import ports

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
RECORDINGS = REPO / "tests" / "fixtures" / "recordings"
# A missing real peer fails the test; SUPERNODE_TEST_ALLOW_MISSING_PEERS=1 (named in the README) is the one
# explicit opt-out, for a machine where the peers cannot be installed: then such tests skip, saying which peer.
ALLOW_MISSING_PEERS = os.environ.get("SUPERNODE_TEST_ALLOW_MISSING_PEERS", "") == "1"


# The default pause between two looks of wait_for: 20 ms at first, half as long again after each look, at most
# 200 ms. Why not a flat 20 ms: most looks are a scrape of an agent's /metrics or a page of its API, rendered there
# and parsed here; a wait of 30 s at 50 looks a second cost more CPU than the agents it waited on (a fifth of a
# module's, profiled), on a 2-core machine where the suite's time is CPU. A condition met at once is still seen
# within 20 ms; one met late within 200 ms.
FIRST_LOOK_SECONDS, BACKOFF, LAST_LOOK_SECONDS = 0.02, 1.5, 0.2


# SUPERNODE_TRACE_WAITS=1: every wait_for says how long it waited and for what (stderr, `pytest -s`): where a slow
# test's time goes, when cutting the suite's time.
TRACE_WAITS = os.environ.get("SUPERNODE_TRACE_WAITS") == "1"


def wait_for(cond: Callable[[], T], timeout: float = 10.0, interval: float | None = None,
             what: str = "condition") -> T:
    """Poll `cond` until it returns something truthy; fail with `what` after `timeout` seconds. `interval`: a fixed
    pause between looks (default: FIRST_LOOK_SECONDS growing to LAST_LOOK_SECONDS)."""
    start = time.monotonic()
    deadline = start + timeout
    last: T | None = None
    pause = FIRST_LOOK_SECONDS if interval is None else interval
    while time.monotonic() < deadline:
        last = cond()
        if last:
            if TRACE_WAITS:
                print(f"[wait_for] {time.monotonic() - start:6.2f}s {what}", file=sys.stderr)
            return last
        time.sleep(pause)
        if interval is None:
            pause = min(pause * BACKOFF, LAST_LOOK_SECONDS)
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
    """A loopback port outside the ephemeral range (see sim/ports.py: why not the kernel's choice)."""
    return ports.free_port(kind)


def unit_environment(unit_text: str) -> dict[str, str]:
    """The variables a systemd unit's `Environment=NAME=value` lines set (one assignment a line, as ours has)."""
    return dict(line.split("=", 1)[1].split("=", 1) for line in unit_text.splitlines()
                if line.startswith("Environment="))


def require_binary(name: str) -> str:
    """Path of a real peer's binary. Missing: fail (make test installs it), unless explicitly allowed to skip."""
    path = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None)
    if path:
        return path
    if ALLOW_MISSING_PEERS:
        pytest.skip(f"{name} not installed (SUPERNODE_TEST_ALLOW_MISSING_PEERS=1)")
    pytest.fail(f"real peer {name!r} is not installed (make test installs it; "
                "SUPERNODE_TEST_ALLOW_MISSING_PEERS=1 skips instead)")


def recording(relpath: str) -> Path:
    """A recording of a real device kept in tests/fixtures/recordings (see its README for provenance)."""
    path = RECORDINGS / relpath
    if not path.exists():
        pytest.fail(f"recording {path} is missing from the repository")
    return path


def fill_filesystem(mnt: Path) -> Path:
    """Write zeros into `mnt/filler` until the filesystem refuses even one more byte (ENOSPC): a really full
    disk. Large writes first, then smaller ones: a partly refused large write leaves room a SQLite page fits in."""
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (65536, 4096, 512, 1):
            try:
                while True:
                    if f.write(b"\0" * chunk) == 0:
                        break
            except OSError:
                pass
    return filler
