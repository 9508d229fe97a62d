"""The reference job's event log as the drill reads it (agent/drill/job_check.py): a job drilled twice."""

from __future__ import annotations

import json

from agent.drill.job_check import job_events


def _log(tmp_path, *events: dict) -> object:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def test_a_second_drill_of_the_same_job_reads_its_own_checkpoint_and_resume_not_the_first_drills(tmp_path):
    log = _log(tmp_path,
               {"ts": 100.0, "job": "7", "node": "n1", "event": "start", "step": 0, "from_checkpoint": False},
               {"ts": 110.0, "job": "7", "node": "n1", "event": "checkpoint", "step": 100, "signal": "USR1"},
               {"ts": 121.0, "job": "7", "node": "n2", "event": "start", "step": 100, "from_checkpoint": True},
               {"ts": 200.0, "job": "7", "node": "n2", "event": "checkpoint", "step": 890, "signal": "USR1"},
               {"ts": 150.0, "job": "8", "node": "n2", "event": "start", "step": 0, "from_checkpoint": False},
               {"ts": 211.0, "job": "7", "node": "n1", "event": "start", "step": 890, "from_checkpoint": True})
    first = job_events(log, "7", since=105.0)
    assert (first.checkpoint["step"], first.resumed["node"], first.resumed["ts"]) == (100, "n2", 121.0)
    second = job_events(log, "7", since=190.0)  # the second drill began at 190
    assert (second.checkpoint["step"], second.resumed["node"], second.resumed["ts"]) == (890, "n1", 211.0)
    assert len(second.starts) == 3  # every start is still the job's (the drill follows a job that writes here)
    assert job_events(log, "7", since=300.0).checkpoint is None  # a third drill: no checkpoint of its own yet


def test_a_checkpoint_without_its_time_is_said_not_taken(tmp_path):
    log = _log(tmp_path, {"job": "7", "node": "n1", "event": "checkpoint", "step": 5, "ts": "soon"})
    ev = job_events(log, "7", since=0.0)
    assert ev.checkpoint is None and "line 1: a checkpoint without its time" in (ev.unreadable or "")
