"""A drill's rack records (agent/drill/records.py) on any input: an announcement counts only with its admin
token's proof over the very record, for a plan valid on this rack and not past its abort; a node's progress only
in its shape. Pure functions: no agent, no peer."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, strategies as st

from agent.coordination.records import RecordError
from agent.drill.plan import parse_plan
from agent.drill.records import Announced, announcement, check_announcement, check_progress, parse_node_doc
from agent.drill.scenarios import Rack

NOW = 1_900_000_000.0
SKEW = 5.0
TOKENS = {"admin": "the-admin-token"}
RACK = Rack(node="n2", nodes=["n1", "n2", "n3"], zones={"z": ["n1", "n2"], "y": ["n3"]})
PLAN = parse_plan({"name": "d", "scenario": {"kind": "leak", "zone": "z"}, "nodes": ["n1", "n2"]})
GENUINE = announcement(PLAN, "d@n1:1", "admin", "n1", NOW - 10, False, TOKENS["admin"])
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                         max_size=4),
                           max_leaves=20)


def check(value, publisher: str = "n1") -> Announced:
    return check_announcement(value, publisher, TOKENS, RACK, NOW, SKEW)


def test_a_genuine_announcement_is_taken_with_its_plan():
    ann = check(json.loads(json.dumps(GENUINE)))  # as read back from the wire
    assert (ann.id, ann.by, ann.via, ann.plan, ann.state) == ("d@n1:1", "admin", "n1", PLAN, "running")


@pytest.mark.parametrize("field,value", [("plan", {**GENUINE["plan"], "nodes": ["n1", "n2", "n3"]}),
                                         ("plan", {**GENUINE["plan"], "real": ["drain", "cdu_write"]}),
                                         ("started_at", NOW), ("state", "ending"), ("allow_jobs", True),
                                         ("id", "d@n1:2"), ("aborted_by", "admin")])
def test_an_announcement_altered_after_signing_is_refused(field, value):
    with pytest.raises(RecordError) as err:
        check({**GENUINE, field: value})
    assert err.value.why == "bad_proof"


@pytest.mark.parametrize("doc,publisher,why", [
    (GENUINE, "n3", "mismatch"),  # another agent serving n1's announcement as its own
    ({k: v for k, v in GENUINE.items() if k != "proof"}, "n1", "no_proof"),
    (announcement(PLAN, "d@n1:1", "root", "n1", NOW, False, "x"), "n1", "unknown_token"),
    (announcement(PLAN, "d@n1:1", "admin", "n1", NOW, False, "a guessed token"), "n1", "bad_proof"),
    (announcement(PLAN, "d@n1:1", "admin", "n1", NOW - 901 - SKEW, False, TOKENS["admin"]), "n1", "expired"),
    (announcement(PLAN, "d@n1:1", "admin", "n1", NOW + 60, False, TOKENS["admin"]), "n1", "future"),
    (announcement(parse_plan({"name": "d", "scenario": {"kind": "leak", "zone": "z"}, "nodes": ["n1"]}), "d@n1:1",
                  "admin", "n1", NOW, False, TOKENS["admin"]), "n1", "plan"),  # signed, but leaves n2 of its zone out
])
def test_a_forged_replayed_or_invalid_announcement_is_refused_naming_why(doc, publisher, why):
    with pytest.raises(RecordError) as err:
        check(doc, publisher)
    assert err.value.why == why


@given(value=json_values)
def test_any_announcement_or_progress_is_taken_or_refused_never_raises_otherwise(value):
    for fn in (lambda v: check(v), lambda v: check_progress(v, NOW, SKEW),
               lambda v: parse_node_doc(json.dumps(v, allow_nan=True), "n1", RACK.nodes)):
        try:
            fn(value)
        except RecordError:
            pass


@given(field=st.sampled_from(sorted(GENUINE)), value=json_values)
def test_no_field_of_a_genuine_announcement_can_be_changed_and_still_be_taken(field, value):
    if value == GENUINE[field]:
        return
    with pytest.raises(RecordError):
        check({**GENUINE, field: value})


def test_a_progress_in_its_shape_is_taken_and_one_that_is_not_is_refused():
    good = {"drill": "d@n1:1", "state": "running", "why": "", "incident": "inc-1", "incident_state": "mitigated",
            "signal": True, "stages": {"detected": {"at": NOW - 5, "journal": [3]}, "drained": {"why": "not yet"}},
            "dry_run": [{"action": "cdu_write", "target": "cdu=cdu1", "seq": 4}], "touched": ["node=n1"]}
    assert check_progress(good, NOW, SKEW) == good
    # every state an incident can be in is taken (a leak whose valve stayed dry-run is `partial`: refusing it would
    # leave the conductor's later records, its end among them, unread by every other part)
    for state in ("open", "mitigating", "mitigated", "partial", "failed", "observed", "resolved"):
        assert check_progress({**good, "incident_state": state}, NOW, SKEW)["incident_state"] == state
    for bad in ({**good, "state": "won"}, {**good, "incident_state": "exploded"},
                {**good, "signal": "yes"}, {**good, "stages": {"drained": {"at": NOW + 60}}},
                {**good, "stages": {"rebooted": {"why": ""}}}, {**good, "touched": ["a\nb"]},
                {**good, "dry_run": [{"action": "x", "target": "y", "seq": "4"}]}, {**good, "drill": "a b"}):
        with pytest.raises(RecordError):
            check_progress(bad, NOW, SKEW)
