"""Keeping the agent's resident memory to what it uses: glibc's malloc_trim, reached through ctypes.

Why: start-up (the config, loaded twice by `run`; the profiles; pydantic's schemas) frees megabytes that
glibc keeps mapped inside the heap, and they would count in the resident memory an operator sees for the
agent's whole life. Trimming once start-up (or a reload) is done hands them back: 1.4 MiB of the demo
node's 66.8 (bench/bench_overhead.py). Not glibc (musl): nothing to do. Capping the heap arenas
(mallopt M_ARENA_MAX 2) was measured too and saved nothing on top of it.

And again every TRIM_SECONDS while it runs (`trim_heap_forever`): in the demo layout a running agent's resident
memory rose 0.1-0.3 MiB a minute over its first half hour while its live Python blocks grew by ~1,000 in 4
minutes (what was freed stayed mapped inside glibc's heap); one malloc_trim 19 minutes in gave back 1.2 MiB.
A trim takes well under a millisecond.
"""

from __future__ import annotations

import asyncio
import ctypes
import mimetypes
import os
import sys
from typing import Mapping

# How the daemon runs, everywhere it is started (the systemd unit, `make demo`, the tests' daemons, the
# benchmarks): Python's optimisation level 2 leaves docstrings and assert statements out of the bytecode. The
# agent holds ~630 modules' code for its whole life, and their docstrings were 2.1 MiB of the demo node's
# 64.7 MiB (bench/bench_overhead.py, same hour: 62.6 MiB with it). Nothing the daemon runs reads a docstring,
# and no library it loads catches an AssertionError. The systemd unit sets the same (tests/test_systemd.py).
DAEMON_ENV: Mapping[str, str] = {"PYTHONOPTIMIZE": "2"}


def daemon_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to start `supernode-agent run` in: `base` (this process's environment) plus DAEMON_ENV."""
    return {**(os.environ if base is None else base), **DAEMON_ENV}


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)  # the process's own symbols: libc's, without looking for the file
    except OSError:
        return None


def return_free_heap() -> bool:
    """Give heap pages that are free back to the kernel (after start-up, after a reload); True if done."""
    libc = _libc()
    try:
        return libc is not None and bool(libc.malloc_trim(0))
    except AttributeError:
        return False


TRIM_SECONDS = 300.0


async def trim_heap_forever(every: float = TRIM_SECONDS) -> None:
    """Hand the heap's free pages back every `every` seconds, for as long as the agent runs (cancel to stop)."""
    while True:
        await asyncio.sleep(every)
        return_free_heap()


def skip_system_mime_types() -> bool:
    """Keep aiohttp from loading the system's MIME database into the daemon; True if it was still unread.

    Why: aiohttp builds its static-file type map when `aiohttp.web` is first imported, and that reads
    /etc/mime.types (~2,000 types on Debian) into the process for good: 0.35 MiB of the demo node's resident
    memory (bench/bench_overhead.py, A/B over three runs each). The agent serves no files, so Python's
    built-in table of common types is plenty. Call it before `aiohttp.web` is imported: a database that is
    already loaded stays as it is."""
    if mimetypes.inited or "aiohttp.web" in sys.modules:
        return False
    mimetypes.knownfiles = []
    return True
