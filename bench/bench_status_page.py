"""The status page: how long a change in the rack takes to reach the page, and what an open page costs the agent.

A simulated rack (2 GB200 nodes x 4 GPUs, the demo's devices and intervals: leak poll 0.5 s) and one real agent
process per node, as `make demo` runs them; headless Chromium on node01's page with the admin token.

  latency   zone-b's leak sensor flipped wet, then dry, in the simulator (RUNS times each): from the inject or
            clear returning to the page's zone row saying so, polled in the page every 20 ms. The agent polls
            the sensor every 0.5 s, a wet reading needs a second poll (an immediate re-read), and the stream
            sends at most 4 updates a second.
  cost      node01's agent process, process_cpu_seconds_total over WINDOW s with no page open, then with one
            page streaming (the view built at most 4 times a second), and the views it built meanwhile.

Figures, not assertions (the tests only wait with a deadline). BENCH_RUNS (default 20) and BENCH_WINDOW
(default 60 s) override the counts.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from tests.browser import chromium  # noqa: E402
from tests.statusrack import TOKEN, status_rack  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "20"))
WINDOW = float(os.environ.get("BENCH_WINDOW", "60"))


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _until(driver, script: str, timeout: float = 10.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if driver.execute_script(script):
            return time.monotonic() - start
        time.sleep(0.02)
    raise TimeoutError(script)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-status-") as tmp, status_rack(Path(tmp)) as rs:
        agent = rs.agents["node01"]

        def cpu() -> tuple[float, float]:
            text = agent.metrics()
            return _metric(text, "process_cpu_seconds_total"), _metric(text, "supernode_status_page_updates_total")

        c0, _ = cpu()
        t0 = time.monotonic()
        time.sleep(WINDOW)
        c1, _ = cpu()
        idle = (c1 - c0) / (time.monotonic() - t0)

        d = chromium(1280, 1000)
        try:
            d.get(agent.url + "/")
            d.find_element("id", "token").send_keys(TOKEN)
            d.find_element("css selector", "#token-form button[type=submit]").click()
            _until(d, "return document.getElementById('token-note').textContent.includes('Incidents visible')", 20)
            c0, b0 = cpu()
            t0 = time.monotonic()
            time.sleep(WINDOW)
            c1, b1 = cpu()
            elapsed = time.monotonic() - t0
            watched = (c1 - c0) / elapsed
            builds = (b1 - b0) / elapsed

            wet, dry = [], []
            zone = "document.querySelector('[data-zone=\"zone-b\"]').dataset.state === '{}'"
            for _ in range(RUNS):
                rs.rack.inject("leak", zone="zone-b")
                wet.append(_until(d, "return " + zone.format("wet")))
                rs.rack.clear()
                dry.append(_until(d, "return " + zone.format("dry")))
        finally:
            d.quit()
    for name, xs in (("wet", wet), ("dry", dry)):
        print(f"leak sensor {name} -> page: p50 {statistics.median(xs) * 1000:.0f} ms, "
              f"p99 {_pct(xs, 0.99) * 1000:.0f} ms, max {max(xs) * 1000:.0f} ms ({len(xs)} runs)")
    print(f"node01 agent CPU: {idle * 100:.2f} % of a core with no page open, {watched * 100:.2f} % with one page "
          f"streaming ({builds:.2f} views built a second; +{(watched - idle) * 100:.2f} %), {WINDOW:.0f} s each")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
