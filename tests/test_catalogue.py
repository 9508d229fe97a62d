"""The metric catalogue (docs/metrics.md) is generated from the code's declarations and covers what is served."""

from __future__ import annotations

import re

from agent.catalogue import CATALOGUE, declared, render, table
from tests.helpers import REPO


def test_the_committed_catalogue_is_current():
    assert table(CATALOGUE.read_text()) == render(), "docs/metrics.md is stale: run python -m agent.catalogue"


def test_every_family_of_the_golden_exposition_is_declared():
    served = set(re.findall(r"^# TYPE (\S+) (\S+)$", (REPO / "tests" / "golden" / "metrics.txt").read_text(), re.M))
    names = set(declared())
    assert served, "the check would pass vacuously"
    missing = {n for n, kind in served if n not in names and f"{n}_total" not in names}
    assert not missing


def test_remediation_counters_of_known_labels_start_at_zero(tmp_path):
    """A quiet rack: every playbook's actions and guardrails, every detector's incidents are already series."""
    from prometheus_client import CollectorRegistry, generate_latest

    from tests.remediation_support import engine

    eng = engine(tmp_path)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(eng.collector())
    text = generate_latest(registry).decode()
    for book in eng.playbooks:
        step = book.steps[0]
        assert f'supernode_remediation_actions_total{{action="{step.action}",playbook="{book.name}",result="failed"}} 0.0' \
            in text, book.name
        assert f'supernode_remediation_blocked_total{{guardrail="cooldown",playbook="{book.name}"}} 0.0' in text
        drains = any(s.action == "drain" for s in book.steps)
        blast = f'supernode_remediation_blocked_total{{guardrail="blast_radius",playbook="{book.name}"}} 0.0'
        assert (blast in text) == drains, (book.name, drains)  # only a drain can meet the blast radius
        asks = any(s.approval or s.undo_approval for s in book.steps)
        approval = f'supernode_remediation_blocked_total{{guardrail="approval",playbook="{book.name}"}} 0.0'
        assert (approval in text) == asks, (book.name, asks)
    assert any(any(s.action == "drain" for s in b.steps) for b in eng.playbooks)  # both sides of the check ran
    assert not all(any(s.action == "drain" for s in b.steps) for b in eng.playbooks)
    assert 'supernode_incidents_total{detector="leak",severity="critical"} 0.0' in text
    assert 'supernode_incident_duration_seconds_count{detector="leak"} 0.0' in text
    assert 'supernode_incident_outcomes_total{detector="leak",outcome="failed"} 0.0' in text
