"""Keeping the agent's resident memory to what it uses: glibc's malloc_trim, reached through ctypes.

Why: start-up (the config, loaded twice by `run`; the profiles; pydantic's schemas) frees megabytes that
glibc keeps mapped inside the heap, and they would count in the resident memory an operator sees for the
agent's whole life. Trimming once start-up (or a reload) is done hands them back: 1.4 MiB of the demo
node's 66.8 (bench/bench_overhead.py). Not glibc (musl): nothing to do. Capping the heap arenas
(mallopt M_ARENA_MAX 2) was measured too and saved nothing on top of it.
"""

from __future__ import annotations

import ctypes
import mimetypes
import sys


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
