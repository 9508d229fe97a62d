"""Tray leak -> first action's intent in a real agent's journal, through Redfish: with event push, and polling only,
beside the Modbus leak path, all against one simulated rack in one run.

  redfish + SSE     the tray BMC's moisture detector turns Critical; its event (Environmental
                    LeakDetectedCritical over the BMC's SSE stream) triggers an immediate read of the
                    detectors, the first wet reading an immediate re-read (two consecutive wet polls), the
                    leak-response playbook writes its first intent. Redfish poll interval 2 s (the shipped one).
  redfish polling   the same with `sources.redfish.events: off`: the next timed poll (2 s) sees it.
  modbus            the simulated leak controller's rope goes wet, polled every 0.5 s (the shipped leak poll).

A real agent process (sim.demo.agent_config: HTTPS with the run's CA, a session login) per case; the times
are the journal's first intent after the injection minus the injection's wall time (same host clock).
RUNS injections per case (default 30; BENCH_RUNS overrides it), each at a random phase against the poll
timers, each waiting until the incident resolved and its undo finished. Aim: push-path p99 < 100 ms.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from sim.demo import agent_config  # noqa: E402
from tests.agentproc import running_agent  # noqa: E402
from tests.helpers import free_port  # noqa: E402
from sim.harness import sim_rack  # noqa: E402
from timing import percentiles, until  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "30"))
REDFISH_POLL = 2.0
MODBUS_POLL = 0.5
TOKEN = "bench-token"
CASES = ("redfish + SSE", "redfish polling", "modbus")


def config(rack, work: Path, case: str) -> dict:
    for name in ("admin.token", "webhook.token"):
        (work / name).write_text(TOKEN + "\n")
    cfg = agent_config(rack.sim, "node01", free_port(), work, mode="enforce")
    cfg["sources"]["leak"] = {"interval": MODBUS_POLL, "timeout": 0.4}
    cfg["sources"]["redfish"] = {"interval": REDFISH_POLL, "timeout": 1.5,
                                 "events": "off" if case == "redfish polling" else "auto"}
    cfg["remediation"] = {"slurm": {"backend": "simulated"},
                          "detectors": {"leak": {"clear_seconds": 0.2}, "leak_tray": {"clear_seconds": 0.2}},
                          # each run's undo at once (issue 35's dry hold is not what this bench times)
                          "leak_scope": {"dry_hold_seconds": 0},
                          "guardrails": {"automatic": ["resume_after_leak", "resume_after_check", "cdu_write_valve"],
                                         "cooldown_seconds": 0, "max_drained_fraction": 1.0,
                                         "breaker_max_actions": 100000, "rate_per_hour": {"default": 100000}}}
    return cfg


def run_case(rack, work: Path, case: str) -> list[float]:
    work.mkdir(parents=True)
    cfg = config(rack, work, case)
    journal = Path(cfg["agent"]["state_dir"]) / "journal.db"
    lat: list[float] = []
    with running_agent(cfg, work) as agent:
        def incidents() -> dict:
            return json.loads(agent.get("/api/v1/incidents", token=TOKEN)[1])

        def first_intent_after(seq: int):
            """The first action of a new incident (an undo of the previous one is not)."""
            with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as db:
                return db.execute("SELECT seq, ts FROM journal WHERE kind = 'intent' AND seq > ? "
                                  "AND json_extract(detail, '$.phase') = 'apply' ORDER BY seq LIMIT 1",
                                  (seq,)).fetchone()

        def quiet() -> bool:
            """Resolved, undone, nothing pending, and the journal still for a moment: the rack is back to nominal."""
            inc = incidents()
            if inc["open"] or inc["pending_approvals"]:
                return False
            seq = last_seq()
            time.sleep(0.3)
            return last_seq() == seq

        def last_seq() -> int:
            with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as db:
                return db.execute("SELECT COALESCE(MAX(seq), 0) FROM journal").fetchone()[0]

        until(lambda: agent.get("/readyz")[0] == 200, 30, "agent ready")
        if case == "redfish + SSE":
            until(lambda: 'supernode_redfish_event_stream_up{bmc="bmc-node01",transport="sse"} 1.0' in agent.metrics(),
                  30, "SSE stream open")
        for i in range(RUNS):
            seq = last_seq()
            time.sleep(random.uniform(0, REDFISH_POLL if case.startswith("redfish") else MODBUS_POLL))
            t0 = time.time()
            if case == "modbus":
                rack.inject("leak", zone="zone-a")
            else:
                rack.inject("tray-leak", node="node01", detector=str(i % 4))
            row = until(lambda: first_intent_after(seq), 15, f"{case}: no intent after the leak", step=0.002)
            lat.append(row[1] - t0)
            if case == "modbus":
                rack.clear()
            else:
                with rack.sim.model.lock:  # the tray dries (only its detectors: `clear` would repower trays)
                    rack.sim.model.nodes["node01"].tray_leaks.clear()
            until(quiet, 60, f"{case}: incident resolved and undone")
    return lat


def main() -> None:
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as d, sim_rack(Path(d) / "rack") as rack:
        for n, case in enumerate(CASES):
            results[case] = run_case(rack, Path(d) / f"case{n}", case)
    print(f"tray leak injected in the simulator -> first intent in a real agent's journal, {RUNS} injections per case "
          f"(Redfish poll {REDFISH_POLL:g} s, Modbus leak poll {MODBUS_POLL:g} s, random phase):")
    for case in CASES:
        p50, p99 = percentiles(results[case])
        slowest = ", ".join(f"{x * 1000:.0f}" for x in sorted(results[case])[-3:])
        print(f"  {case:16s} p50 {p50 * 1000:7.1f} ms   p99 {p99 * 1000:7.1f} ms   (three slowest: {slowest} ms)")
    p50, p99 = percentiles(results["redfish + SSE"])
    print(f"  aim: push path p99 < 100 ms -> {'met' if p99 < 0.1 else 'NOT met'}")
    m50, m99 = percentiles(results["modbus"])
    print(f"  push path / Modbus path: p50 {p50 / m50:.2f}x   p99 {p99 / m99:.2f}x")


if __name__ == "__main__":
    main()
