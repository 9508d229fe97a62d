"""Goodput in `report` (issue 36): outages from the journal, counted once, clipped to the window, by cause class.

The journals are written through the journal's own API with explicit timestamps (a deterministic clock): the
rows are those the engine writes (intent/result of drain and node_reboot, undo results, maintenance rows,
incident rows), with the shapes of agent/remediation/step_runner.py, reconcile.py and maintenance.py.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
import sys
import time

import pytest
from hypothesis import given, strategies as st

from agent.goodput import CAUSES, DETECTOR_CAUSE, JournalRead, attribute, cause_of, goodput_report, outages
from agent.remediation.journal import Journal

from tests.helpers import REPO

H = 3600.0
T = 1_800_000_000.0  # "now" of the deterministic tests


def incident(j: Journal, iid: str, detector: str, node: str, at: float, detail: dict | None = None) -> None:
    j.append("incident", incident_id=iid, result="open", ts=at,
             detail={"id": iid, "detector": detector, "targets": {"node": node}, "opened_at": at,
                     "resolved_at": None, "detail": detail or {}})


def drain(j: Journal, iid: str, node: str, at: float, undone: float | None, jobs: list[str] | None,
          owned: bool = True) -> None:
    """A drain step as the step runner journals it: the intent with its plan (the jobs on the node at that
    moment), the result, and the undo's intent and result when the incident cleared."""
    aid, tgt = f"{iid}:0:node={node}", f"node={node}"
    plan = {"before": {"state": "allocated", "reason": "", "owned": owned}, "reason": f"supernode-agent: {iid}"}
    if jobs is not None:
        plan["jobs"] = jobs
    j.append("intent", action_id=aid, incident_id=iid, playbook="p", action="drain", target=tgt, ts=at,
             detail={"plan": plan, "params": {}, "phase": "apply"})
    j.append("result", action_id=aid, incident_id=iid, playbook="p", action="drain", target=tgt, result="done",
             ts=at, detail={"phase": "apply", "before": plan["before"], "after": {"state": "drained"},
                            "skipped": not owned})
    if undone is not None:
        j.append("intent", action_id=aid + ":undo", incident_id=iid, action="drain", target=tgt, ts=undone,
                 detail={"phase": "undo", "apply_action_id": aid})
        j.append("result", action_id=aid + ":undo", incident_id=iid, action="drain", target=tgt, result="undone",
                 ts=undone, detail={"phase": "undo", "apply_action_id": aid})


def reboot(j: Journal, iid: str, node: str, at: float, back: float | None, jobs: list[str]) -> None:
    aid, tgt = f"{iid}:0:node={node}", f"node={node}"
    j.append("intent", action_id=aid, incident_id=iid, action="node_reboot", target=tgt, ts=at,
             detail={"plan": {"before": {"boot_time": at - 86400}, "jobs": jobs}, "phase": "apply"})
    if back is not None:
        j.append("result", action_id=aid, incident_id=iid, action="node_reboot", target=tgt, result="done", ts=back,
                 detail={"phase": "apply", "after": {"boot_time": back - 60}})


def maintenance(j: Journal, node: str, on: float, until: float | None, off: float | None = None) -> None:
    j.append("maintenance", target=node, result="on", ts=on, detail={"by": "alice", "until": until})
    if off is not None:
        j.append("maintenance", target=node, result="off", ts=off, detail={"by": "alice", "until": None})


def journals(tmp_path, now: float, open_gpu: bool = True, edge: bool = True) -> list[JournalRead]:
    """node01's and node02's journals (4 GPUs per node), each agent started ten days before `now`:

    node01: an NVLink drain from now-26h to now-22h (the window's edge cuts it to 2 h), a leak drain from now-20h to
    now-17h with jobs 101 and 102 on the node (3 h), a gpu_lost drain from now-2h still open (2 h up to now, no job).
    node02: XID 79's reboot (gpu_reboot_required) from now-10h to now-9.5h with job 201 (30 min), overlapping a
    maintenance window from now-9h45m until now-9h (its `until`: no off row): the overlap's 15 min go to the reboot,
    which took the node out first; the maintenance keeps its last 30 min. node02 out 1 h, not 1 h 15.
    """
    out = []
    for node in ("node01", "node02"):
        j = Journal(tmp_path / f"{node}.db")
        j.append("engine", result="started", ts=now - 10 * 86400, detail={"node": node, "rack": "r01"})
        if node == "node01":
            if edge:
                incident(j, "n1", "nvlink_errors", node, now - 26 * H)
                drain(j, "n1", node, now - 26 * H, now - 22 * H, ["99"])
            incident(j, "l1", "leak", node, now - 20 * H)
            drain(j, "l1", node, now - 20 * H, now - 17 * H, ["101", "102"])
            if open_gpu:
                incident(j, "g1", "gpu_lost", node, now - 2 * H)
                drain(j, "g1", node, now - 2 * H, None, [])
        else:
            incident(j, "r1", "gpu_reboot_required", node, now - 10 * H, {"xid": 79})
            reboot(j, "r1", node, now - 10 * H, now - 9.5 * H, ["201"])
            maintenance(j, node, now - 9.75 * H, until=now - 9 * H)
        assert j.flush()
        out.append(JournalRead(j.entries(), node, node))
        j.close()
    return out


def test_hand_computed_gpu_hours_and_availability(tmp_path):
    """Window: the last 24 h; 2 nodes x 4 GPUs; both agents ran the whole window (observed 24 h each, 48 h).

    node01: nvlink 2 h (now-24h..now-22h, the window cuts the 4 h drain) + leak 3 h + gpu_other 2 h (open) = 7 h
            -> availability 1 - 7/24 = 17/24 = 70.833 %, GPU-hours lost 7 x 4 = 28
    node02: gpu_reboot 30 min + maintenance 30 min (the 15 min overlap counted once, to the reboot) = 1 h
            -> availability 23/24 = 95.833 %, GPU-hours lost 4
    rack:   8 h of 48 h -> availability 40/48 = 83.333 %, GPU-hours lost 32
    by cause: leak 12, nvlink 8, gpu_other 8, gpu_reboot 2, maintenance 2 GPU-hours (sum 32)
    jobs interrupted: l1 2 (101, 102), r1 1 (201), g1 0, n1's drain started before the window: not listed
    """
    g = goodput_report(journals(tmp_path, T), 4, T - 24 * H, T)
    n1, n2, rack = g["nodes"]["node01"], g["nodes"]["node02"], g["rack"]
    assert n1["out_of_service_seconds"] == pytest.approx(7 * H)
    assert n1["availability"] == pytest.approx(17 / 24) and n1["gpu_hours_lost"] == pytest.approx(28)
    assert n2["out_of_service_seconds"] == pytest.approx(1 * H)
    assert n2["availability"] == pytest.approx(23 / 24) and n2["gpu_hours_lost"] == pytest.approx(4)
    assert rack["availability"] == pytest.approx(40 / 48) and rack["gpu_hours_lost"] == pytest.approx(32)
    lost = {c: s["gpu_hours_lost"] for c, s in rack["by_cause"].items() if s["gpu_hours_lost"]}
    assert lost == pytest.approx({"leak": 12, "nvlink": 8, "gpu_other": 8, "gpu_reboot": 2, "maintenance": 2})
    assert n2["by_state"] == pytest.approx({"drained": 0, "rebooting": 0.5 * H, "maintenance": 0.5 * H})
    jobs = {i["incident_id"]: (i["jobs_interrupted"], i["jobs"]) for i in g["incidents"]}
    assert jobs == {"l1": (2, ["101", "102"]), "r1": (1, ["201"]), "g1": (0, [])}


def test_mtbf_and_mttr_per_cause_say_the_events_they_rest_on(tmp_path):
    """leak: 1 event in the window, 1 repair of 3 h: MTBF = 48 h observed node-time / 1, MTTR 3 h.
    nvlink: its outage started before the window (no event) and ended in it: 1 repair, MTTR its whole 4 h, no MTBF.
    gpu_other: 1 event, still open: no repair, no MTTR."""
    c = goodput_report(journals(tmp_path, T), 4, T - 24 * H, T)["rack"]["by_cause"]
    assert (c["leak"]["events"], c["leak"]["repairs"]) == (1, 1)
    assert c["leak"]["mtbf_seconds"] == pytest.approx(48 * H) and c["leak"]["mttr_seconds"] == pytest.approx(3 * H)
    assert (c["nvlink"]["events"], c["nvlink"]["repairs"], c["nvlink"]["mtbf_seconds"]) == (0, 1, None)
    assert c["nvlink"]["mttr_seconds"] == pytest.approx(4 * H)
    assert (c["gpu_other"]["events"], c["gpu_other"]["repairs"], c["gpu_other"]["mttr_seconds"]) == (1, 0, None)


def test_overlapping_outages_count_once_to_the_first_that_took_the_node_out():
    """A [0, 10], B [5, 20] (B started while A held the node), C [12, 14] inside B: the node was out 20 s;
    A gets 10, B the 10 after A ended (C's 2 s are inside B's and count once, to B)."""
    from agent.goodput import Outage

    a, b, c = (Outage("n", 0, 10, "drained", "leak", 1), Outage("n", 5, 20, "rebooting", "gpu_reboot", 2),
               Outage("n", 12, 14, "maintenance", "maintenance", 3))
    assert attribute([c, b, a], 0, 100) == 20
    assert (a.attributed_seconds, b.attributed_seconds, c.attributed_seconds) == (10, 10, 0)
    assert attribute([a, b], 8, 30) == 12  # the window's edges clip: A 8..10, B 10..20
    assert (a.attributed_seconds, b.attributed_seconds) == (2, 10)


def test_an_open_outage_counts_up_to_now(tmp_path):
    """g1's drain (now-2h, never undone): 2 h when the report runs at now, 3 h an hour later."""
    reads = journals(tmp_path, T, edge=False)
    assert goodput_report(reads, 4, T - 24 * H, T)["nodes"]["node01"]["out_of_service_seconds"] == pytest.approx(5 * H)
    later = goodput_report(reads, 4, T - 23 * H, T + H)["nodes"]["node01"]
    assert later["out_of_service_seconds"] == pytest.approx(6 * H)
    assert later["by_cause"]["gpu_other"]["out_of_service_seconds"] == pytest.approx(3 * H)


def test_a_drain_found_in_place_took_nothing_out_and_maintenance_ends_at_its_off_row(tmp_path):
    j = Journal(tmp_path / "j.db")
    j.append("engine", result="started", ts=T - 48 * H, detail={"node": "node01"})
    incident(j, "b1", "gpu_lost", "node01", T - 5 * H)
    drain(j, "b1", "node01", T - 5 * H, None, [], owned=False)  # bob's drain: not ours, no outage
    maintenance(j, "node01", T - 4 * H, until=T + 10 * H, off=T - 3 * H)  # ended by hand before its until
    assert j.flush()
    found = outages(j.entries())
    j.close()
    assert [(o.state, o.start, o.end) for o in found] == [("maintenance", T - 4 * H, T - 3 * H)]


def test_nodes_no_journal_covers_are_unknown_not_available(tmp_path):
    """The inventory names node03, whose journal was not read: listed, availability and GPU-hours unknown (null),
    and the rack's figures are over the two nodes observed, saying 2 of 3."""
    g = goodput_report(journals(tmp_path, T), 4, T - 24 * H, T, nodes=["node01", "node02", "node03"])
    assert g["nodes"]["node03"]["availability"] is None and g["nodes"]["node03"]["gpu_hours_lost"] is None
    assert (g["rack"]["nodes"], g["rack"]["nodes_observed"]) == (3, 2)
    assert g["rack"]["availability"] == pytest.approx(40 / 48)
    (tmp_path / "x").mkdir()
    unknown_gpus = goodput_report(journals(tmp_path / "x", T), None, T - 24 * H, T)  # no inventory: GPU count unknown
    assert unknown_gpus["rack"]["gpu_hours_lost"] is None and unknown_gpus["rack"]["availability"] is not None


def test_every_shipped_detector_has_a_cause_class():
    """A new detector must be given a cause (DETECTOR_CAUSE): `other` is for what no detector of ours names."""
    from agent.remediation.detectors import Context, Detectors
    from agent.remediation.playbooks import load_playbooks
    from agent.remediation.settings import DetectorSettings, RemediationSettings

    names = set(Detectors(DetectorSettings(), Context("n1", "r01")).trackers)
    names |= {b.trigger.detector for b in load_playbooks(RemediationSettings().playbook_dir) if b.trigger.detector}
    assert sorted(names - set(DETECTOR_CAUSE)) == []
    assert set(DETECTOR_CAUSE.values()) <= set(CAUSES)
    assert cause_of("SomeAlertname") == "other"
    assert cause_of("leak", {"detail": {"drill": True}}) == "drill"  # a drill's incident, whatever its detector
    assert cause_of("gpu_reboot_required") == "gpu_reboot"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", "--config", "/nonexistent.yaml", "report", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60)


def test_report_cli_formats_on_two_nodes_journals(tmp_path):
    """The same journals with every outage closed and inside the window (so the figures do not move with the
    clock): node01 3 h (leak), node02 1 h over the last 24 h -> availability 21/24 and 23/24, rack 44/48;
    GPU-hours 12, 4, 16."""
    journals(tmp_path, time.time(), open_gpu=False, edge=False)
    dbs = ["--db", str(tmp_path / "node01.db"), "--db", str(tmp_path / "node02.db"), "--gpus-per-node", "4"]
    run = _cli(*dbs, "--since", "24h", "--format", "json")
    assert run.returncode == 0, run.stderr
    g = json.loads(run.stdout)["goodput"]
    assert g["nodes"]["node01"]["availability"] == pytest.approx(21 / 24)
    assert g["nodes"]["node02"]["gpu_hours_lost"] == pytest.approx(4)
    assert (g["rack"]["availability"], g["rack"]["gpu_hours_lost"]) == pytest.approx((44 / 48, 16))
    rows = list(csv.DictReader(io.StringIO(_cli(*dbs, "--since", "24h", "--format", "csv").stdout)))
    by = {(r["scope"], r["name"], r["cause"]): r for r in rows}
    assert float(by[("rack", "rack", "all")]["gpu_hours_lost"]) == pytest.approx(16)
    assert float(by[("node", "node01", "leak")]["out_of_service_seconds"]) == pytest.approx(3 * H)
    md = _cli(*dbs, "--since", "24h", "--format", "markdown").stdout
    assert "| 2 of 2 | 2.0 d | 4.0 h | 91.667 % | 16.00 |" in md, md
    assert "| l1 | leak | leak | node01 | 2 | 101, 102 |" in md, md
    text = _cli(*dbs, "--since", "24h").stdout  # the default: reliability as before, then goodput
    assert text.index("reliability seen by") < text.index("goodput from")
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 24 * H))
    assert json.loads(_cli(*dbs, "--since", iso, "--json").stdout)["goodput"]["rack"]["gpu_hours_lost"] == \
        pytest.approx(16)


def test_bad_since_and_format_are_named(tmp_path):
    journals(tmp_path, time.time())
    for bad in ("soon", "-3d", "2999-01-01"):
        run = _cli("--db", str(tmp_path / "node01.db"), f"--since={bad}")
        assert run.returncode != 0 and f"--since {bad!r}" in run.stderr, run.stderr
    run = _cli("--db", str(tmp_path / "node01.db"), "--format", "xml")
    assert run.returncode != 0 and "'xml'" in run.stderr and "--format" in run.stderr, run.stderr


def test_a_corrupt_row_or_an_unreadable_journal_gives_no_figure(tmp_path):
    """A row whose detail is not JSON (written past the journal's API) is named by its seq; a file that is no
    database is named; neither prints a report that would silently lack those rows."""
    journals(tmp_path, time.time())
    db = sqlite3.connect(str(tmp_path / "node01.db"))
    db.execute("INSERT INTO journal(ts, kind, result, detail) VALUES (?, 'result', 'done', '{not json')", (time.time(),))
    db.commit()
    seq = db.execute("SELECT MAX(seq) FROM journal").fetchone()[0]
    db.close()
    run = _cli("--db", str(tmp_path / "node01.db"), "--format", "json")
    assert run.returncode != 0 and run.stdout == "" and f"seq {seq}" in run.stderr, run.stderr
    (tmp_path / "junk.db").write_bytes(b"this is not sqlite" * 100)
    run = _cli("--db", str(tmp_path / "junk.db"))
    assert run.returncode != 0 and run.stdout == "" and "junk.db" in run.stderr, run.stderr
    bad_ts = tmp_path / "ts"
    bad_ts.mkdir()
    journals(bad_ts, time.time())
    db = sqlite3.connect(str(bad_ts / "node02.db"))
    db.execute("INSERT INTO journal(ts, kind, result, detail) VALUES ('yesterday', 'engine', 'started', '{}')")
    db.commit()
    db.close()
    run = _cli("--db", str(bad_ts / "node02.db"), "--format", "json")
    assert run.returncode != 0 and run.stdout == "" and "'yesterday' is not a time" in run.stderr, run.stderr


def test_a_journal_from_before_jobs_were_recorded_says_not_recorded(tmp_path):
    """An old drain row (no `jobs` in its plan) is still an outage; its jobs are unknown, never 0."""
    j = Journal(tmp_path / "j.db")
    j.append("engine", result="started", ts=T - 48 * H)  # an old agent: no node in its start row either
    incident(j, "o1", "leak", "node01", T - 3 * H)
    drain(j, "o1", "node01", T - 3 * H, T - 2 * H, None)
    assert j.flush()
    g = goodput_report([JournalRead(j.entries())], 4, T - 24 * H, T)
    j.close()
    assert g["nodes"]["node01"]["gpu_hours_lost"] == pytest.approx(4)
    assert g["incidents"] == [{"incident_id": "o1", "cause": "leak", "detector": "leak", "nodes": ["node01"],
                               "jobs": None, "jobs_interrupted": None}]


def test_the_agents_series_count_its_own_node_once_by_cause_from_its_start(tmp_path):
    """The agent starts at t=1000 (a deterministic clock). Its journal: a leak drain of node01 from 900 (before the
    start: counted from 1000) undone at 1300; maintenance of node01 from 1200 until 1500 (its `until`); a drain of
    node02 (another node's outage: not in this agent's series). Every row fed twice (the start's read and the
    append hook may both see one): counted once.

    at 1400: leak 300 (1000..1300), maintenance 100 (1300..1400: its 1200..1300 went to the leak), out of service
    at 1600: leak 300, maintenance 200 (1300..1500), in service again
    """
    from prometheus_client import CollectorRegistry

    from agent.goodput_metrics import OutOfServiceTracker

    now = [1000.0]
    tracker = OutOfServiceTracker("node01", clock=lambda: now[0])
    j = Journal(tmp_path / "j.db")
    incident(j, "l1", "leak", "node01", 900)
    drain(j, "l1", "node01", 900, 1300, ["7"])
    maintenance(j, "node01", 1200, until=1500)
    incident(j, "x1", "gpu_lost", "node02", 950)
    drain(j, "x1", "node02", 950, None, [])
    assert j.flush()
    tracker.load(j.entries())
    tracker.load(j.entries())
    j.close()
    reg = CollectorRegistry()

    class Families:  # the engine's collector yields the tracker's families among its own
        def collect(self):
            return tracker.families()
    reg.register(Families())

    def value(cause: str) -> float:
        return reg.get_sample_value("supernode_node_out_of_service_seconds_total", {"cause": cause})
    assert reg.get_sample_value("supernode_node_in_service") == 0  # at the start: the drain from before it holds
    now[0] = 1400.0
    assert (value("leak"), value("maintenance"), value("gpu_other")) == (300, 100, 0)
    assert reg.get_sample_value("supernode_node_in_service") == 0
    now[0] = 1600.0
    assert (value("leak"), value("maintenance")) == (300, 200)
    assert reg.get_sample_value("supernode_node_in_service") == 1
    assert value("drill") == 0 and value("other") == 0  # every cause exported from the start


def test_jobs_a_job_notify_step_requeued_are_interrupted_without_an_outage(tmp_path):
    """An application GPU fault (XID 13, gpu_app_fault): job_notify `requeue` put jobs 301 and 302 back in the
    queue; the node stayed in service (no outage, availability 100 %), and the incident lists both jobs. A
    `comment` step tells the job and interrupts nothing."""
    j = Journal(tmp_path / "j.db")
    j.append("engine", result="started", ts=T - 48 * H, detail={"node": "node01"})
    incident(j, "a1", "gpu_app_fault", "node01", T - H, {"xid": 13})
    j.append("result", action_id="a1:0:node=node01", incident_id="a1", action="job_notify", target="node=node01",
             result="done", ts=T - H, detail={"phase": "apply", "after": {"jobs": ["301", "302"], "done": "requeue",
                                                                          "told": ["301", "302"], "errors": []}})
    incident(j, "a2", "gpu_app_fault", "node01", T - H / 2, {"xid": 13})
    j.append("result", action_id="a2:0:node=node01", incident_id="a2", action="job_notify", target="node=node01",
             result="done", ts=T - H / 2, detail={"phase": "apply", "after": {"jobs": ["303"], "done": "comment",
                                                                              "told": ["303"], "errors": []}})
    assert j.flush()
    g = goodput_report([JournalRead(j.entries(), "node01")], 4, T - 24 * H, T)
    j.close()
    assert g["nodes"]["node01"]["availability"] == 1.0
    assert g["incidents"] == [{"incident_id": "a1", "cause": "gpu_app", "detector": "gpu_app_fault", "nodes": [],
                               "jobs": ["301", "302"], "jobs_interrupted": 2}]


SPANS = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 20), st.booleans()), max_size=8)


@given(SPANS, st.integers(0, 30), st.integers(1, 40))
def test_attribution_matches_second_by_second_counting(spans, lo, width):
    """Integer outages [s, s+d) (or open: up to the window's end) in a window [lo, lo+width): count each second by
    hand, to the earliest-started outage covering it (ties to the lower seq). The sweep gives the same split, and
    the node's total is the union, never the sum."""
    from agent.goodput import Outage

    hi = lo + width
    outs = [Outage("n", s, None if open_ else s + d, "drained", "leak", seq)
            for seq, (s, d, open_) in enumerate(spans)]
    expected = [0] * len(outs)
    union = 0
    for t in range(lo, hi):
        covering = [o for o in outs if o.start <= t and (o.end is None or t < o.end)]
        if covering:
            union += 1
            expected[min(covering, key=lambda o: (o.start, o.seq)).seq] += 1
    assert attribute(outs, lo, hi) == union
    assert [o.attributed_seconds for o in outs] == expected


def test_report_reads_a_journal_written_before_schema_versions(tmp_path):
    """The real pre-version file (tests/fixtures/journal-pre-version, see tests/test_journal_migration.py) is read
    read-only as it is (report never migrates it). Its drain result records no `before` (nothing says the agent
    owned the drain) and it has no engine rows (nothing says when the agent watched): no outage is made up, and
    the rack's availability is unknown, not 100 %."""
    import shutil

    shutil.copy(REPO / "tests" / "fixtures" / "journal-pre-version" / "journal.db", tmp_path / "journal.db")
    run = _cli("--db", str(tmp_path / "journal.db"), "--since", "3650d", "--format", "json")
    assert run.returncode == 0, run.stderr
    g = json.loads(run.stdout)["goodput"]
    assert (g["nodes"], g["incidents"]) == ({}, [])
    assert (g["rack"]["nodes_observed"], g["rack"]["availability"], g["rack"]["gpu_hours_lost"]) == (0, None, None)
    db = sqlite3.connect(str(tmp_path / "journal.db"))
    assert db.execute("PRAGMA user_version").fetchone()[0] == 0  # left as it was
    db.close()


def test_a_failing_row_listener_never_fails_the_row(tmp_path):
    """The goodput tracker is told every row as it is queued; if it raised, the row (a safety step's intent) must
    still be queued and committed, and the step never see the error."""
    j = Journal(tmp_path / "j.db")

    def broken(entry):
        raise RuntimeError("listener bug")
    j.on_append = broken
    seq = j.append("intent", action_id="a", action="drain", target="node=node01", detail={"plan": {}})
    assert j.flush()
    assert [e.seq for e in j.entries()] == [seq]
    j.close()


def test_a_drain_held_by_two_incidents_ends_when_the_last_lets_go(tmp_path):
    """A leak drains node01 at now-5h; a gpu_lost incident at now-4h finds it drained by us and holds it too. A
    person rejects the leak at now-3h (released: the gpu_lost incident still holds the drain), and the gpu_lost
    incident's undo resumes the node at now-1h: out 4 h, all to the leak that took it out; no second outage."""
    j = Journal(tmp_path / "j.db")
    j.append("engine", result="started", ts=T - 48 * H, detail={"node": "node01"})
    incident(j, "l1", "leak", "node01", T - 5 * H)
    drain(j, "l1", "node01", T - 5 * H, None, ["1"])
    incident(j, "g1", "gpu_lost", "node01", T - 4 * H)
    drain(j, "g1", "node01", T - 4 * H, T - 1 * H, ["1"], owned=False)
    tgt = "node=node01"
    released = {"phase": "undo", "apply_action_id": "l1:0:node=node01", "by": "alice"}
    j.append("result", action_id="l1:-1:node=node01:release", incident_id="l1", action="drain", target=tgt,
             result="released", ts=T - 3 * H, detail=released)
    assert j.flush()
    entries = sorted(j.entries(), key=lambda e: (e.ts, e.seq))  # the rows in the order they happened
    j.close()
    g = goodput_report([JournalRead(entries, "node01")], 4, T - 24 * H, T)
    n = g["nodes"]["node01"]
    assert n["out_of_service_seconds"] == pytest.approx(4 * H)
    assert {c: s["out_of_service_seconds"] for c, s in n["by_cause"].items()} == pytest.approx({"leak": 4 * H})
    assert [i["incident_id"] for i in g["incidents"]] == ["l1"]
