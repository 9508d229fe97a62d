"""Goodput (issue 36): what `report`'s goodput and one scrape of the agent's goodput series cost on a busy journal.

The journal: one node's agent over 30 days with INCIDENTS incidents (default 2,000; BENCH_INCIDENTS), each drained
for 10 minutes and undone (every fourth overlapping the one before), a maintenance window every 10 incidents, written
through the journal's own API. Measured, median of RUNS runs (default 7; BENCH_RUNS) in one process:

- `goodput_report` over the journal's rows (agent/goodput.py), and the peer in the same run: `reliability_report`
  over the same rows (the MTBF/MTTR table `report` has always printed), as a ratio;
- one scrape of the engine's goodput tracker (agent/goodput_metrics.py) holding the same rows, the outages already
  derived (they are derived again only when a row comes), and the first scrape after a row came.

Reading the rows from SQLite is the same for both reports and is not in the figures.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from agent.goodput import JournalRead, goodput_report  # noqa: E402
from agent.goodput_metrics import OutOfServiceTracker  # noqa: E402
from agent.reliability import CLASSES, reliability_report  # noqa: E402
from agent.remediation.journal import Journal  # noqa: E402
from timing import median_wall_cpu  # noqa: E402

INCIDENTS = int(os.environ.get("BENCH_INCIDENTS", "2000"))
RUNS = int(os.environ.get("BENCH_RUNS", "7"))
DAY, H = 86400.0, 3600.0


def journal(path: Path, now: float) -> list:
    j = Journal(path)
    j.append("engine", result="started", ts=now - 31 * DAY, detail={"node": "node01"})
    step = 30 * DAY / INCIDENTS
    for k in range(INCIDENTS):
        at = now - 30 * DAY + k * step - (step / 2 if k % 4 == 3 else 0)
        iid, aid, tgt = f"i{k}", f"i{k}:0:node=node01", "node=node01"
        row = {"id": iid, "detector": "gpu_lost", "targets": {"node": "node01"}, "opened_at": at, "detail": {}}
        j.append("incident", incident_id=iid, result="open", ts=at, detail={**row, "resolved_at": None})
        plan = {"before": {"owned": True, "state": "allocated", "reason": ""}, "jobs": [str(k)]}
        j.append("intent", action_id=aid, incident_id=iid, action="drain", target=tgt, ts=at,
                 detail={"plan": plan, "phase": "apply"})
        j.append("result", action_id=aid, incident_id=iid, action="drain", target=tgt, result="done", ts=at,
                 detail={"phase": "apply", "before": plan["before"]})
        j.append("result", action_id=aid + ":undo", incident_id=iid, action="drain", target=tgt, result="undone",
                 ts=at + H / 6, detail={"phase": "undo", "apply_action_id": aid})
        j.append("incident", incident_id=iid, result="resolved", ts=at + H / 6,
                 detail={**row, "resolved_at": at + H / 6})
        if k % 10 == 0:
            j.append("maintenance", target="node01", result="on", ts=at + 0.5 * H, detail={"until": at + 2 * H})
    assert j.flush(60)
    entries = j.entries()
    j.close()
    return entries


def main() -> int:
    import time

    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        entries = journal(Path(tmp) / "journal.db", now)
    counts = dict.fromkeys(CLASSES, 4)
    good_wall, good_cpu = median_wall_cpu(
        lambda: goodput_report([JournalRead(entries, "node01")], 4, now - 30 * DAY, now), RUNS)
    rel_wall, rel_cpu = median_wall_cpu(
        lambda: reliability_report(entries, counts, now - 30 * DAY, now, "node01", {}), RUNS)
    tracker = OutOfServiceTracker("node01", clock=lambda: now)
    tracker.since = now - 30 * DAY
    tracker.load(entries)
    scrape_wall, scrape_cpu = median_wall_cpu(lambda: list(tracker.families()), RUNS)

    def after_a_row() -> None:
        tracker.feed(entries[-1])
        list(tracker.families())
    row_wall, row_cpu = median_wall_cpu(after_a_row, RUNS)
    g = goodput_report([JournalRead(entries, "node01")], 4, now - 30 * DAY, now)
    print(f"journal: {len(entries)} rows, {INCIDENTS} incidents, availability "
          f"{100 * g['rack']['availability']:.2f} %, {g['rack']['gpu_hours_lost']:.0f} GPU-hours lost")
    print(f"goodput_report:     {1000 * good_wall:8.1f} ms wall, {1000 * good_cpu:8.1f} ms CPU (median of {RUNS})")
    print(f"reliability_report: {1000 * rel_wall:8.1f} ms wall, {1000 * rel_cpu:8.1f} ms CPU (the peer)")
    print(f"ratio goodput / reliability (CPU): {good_cpu / rel_cpu:.2f}x")
    print(f"one scrape of the goodput series: {1000 * scrape_wall:8.1f} ms wall, {1000 * scrape_cpu:8.1f} ms CPU")
    print(f"the first scrape after a row:     {1000 * row_wall:8.1f} ms wall, {1000 * row_cpu:8.1f} ms CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
