"""The agent hands the heap pages that start-up freed back to the kernel (agent/memory.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent.memory import return_free_heap, trim_heap_forever
from tests.helpers import await_for


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


def test_a_running_agent_trims_its_heap_again_on_its_timer():
    """What the agent frees while it runs goes back too, at the next tick of its trim timer (not only at start)."""
    async def run() -> None:
        trimmer = asyncio.create_task(trim_heap_forever(every=0.05))
        try:
            blocks = [bytes(4000) + bytes([i % 256]) for i in range(20_000)]  # ~80 MiB, freed below
            keep = bytes(4000) + b"top"
            del blocks
            before = _rss_anon_kib()
            await await_for(lambda: before - _rss_anon_kib() > 40 * 1024, 10,
                            what="the freed heap handed back by the timer")
            assert keep.endswith(b"top")
        finally:
            trimmer.cancel()

    asyncio.run(run())


def _types_seen_by_the_daemon(tmp_path: Path, skip: bool) -> str:
    """Start `supernode-agent run` in a fresh interpreter whose 'system' MIME database is a file of ours, and
    say what type that database's one entry got (the config is absent, so the daemon stops right after its
    imports)."""
    import subprocess
    import sys

    db = tmp_path / "mime.types"
    db.write_text("application/x-supernode-test  snx\n")
    code = (
        "import mimetypes, sys\n"
        f"mimetypes.knownfiles = [{str(db)!r}]\n"
        "from agent import cli, memory\n"
        + ("" if skip else "memory.skip_system_mime_types = lambda: False\n")
        + f"rc = cli.main(['--config', {str(tmp_path / 'absent.yaml')!r}, 'run'])\n"
        "assert rc == 2, rc\n"
        "assert 'aiohttp.web' in sys.modules\n"
        "print(mimetypes.guess_type('a.snx')[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_the_daemon_does_not_load_the_systems_mime_database(tmp_path):
    # Control: left alone, importing the daemon's HTTP stack (aiohttp.web) reads the database.
    assert _types_seen_by_the_daemon(tmp_path, skip=False) == "application/x-supernode-test"
    assert _types_seen_by_the_daemon(tmp_path, skip=True) == "None"
