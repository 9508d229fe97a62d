"""The agent hands the heap pages that start-up freed back to the kernel (agent/memory.py)."""

from __future__ import annotations

from pathlib import Path

from agent.memory import return_free_heap


def _rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


def test_freed_heap_inside_the_heap_goes_back_to_the_kernel():
    # 4 KiB blocks come from malloc's heap (not Python's small-object pools, not mmap); the block allocated
    # after them keeps the heap's top in use, so freeing them leaves the pages mapped until trimmed.
    blocks = [bytes(4000) + bytes([i % 256]) for i in range(20_000)]  # ~80 MiB
    keep = bytes(4000) + b"top"
    del blocks
    before = _rss_anon_kib()
    assert return_free_heap()
    after = _rss_anon_kib()
    assert before - after > 40 * 1024, (before, after)
    assert keep.endswith(b"top")
