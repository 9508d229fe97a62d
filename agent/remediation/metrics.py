"""The remediation families: declared once here (docs/metrics.md is generated from them), rendered per scrape.

Why a custom collector: the values live in the engine (incident book,
counters); `collect()` renders them fresh on each scrape and is registered
on the agent's explicit registry, never the global one.

Why known label values start at zero: a quiet rack must show "0 actions,
0 blocks" on its dashboards, not "No data", and `increase()` must see a
series' first event; so every (playbook, action), (playbook, guardrail),
detector and outcome the agent can produce is exported from the start.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from agent.reliability import CLASSES
from exporters.model import Kind, MetricSpec, counter, gauge, histogram

from .blast import SCHEDULER_UNREACHABLE
from .incidents import DURATION_BUCKETS, OUTCOMES
from .xid_recovery import LADDER

MODES = ("observe", "dry-run", "enforce")
SEVERITIES = ("warning", "critical")
ACTION_RESULTS = ("done", "failed")  # the others (dry_run, undone, blocked...) appear with their first event
GUARDRAILS = ("circuit_breaker", "rate_limit", "cooldown", "blast_radius", "approval", "mode", "maintenance",
              SCHEDULER_UNREACHABLE)
# Every step passes these (step_runner.py: the mode, then breaker, rate, cooldown and maintenance in _reserve).
_EVERY_STEP = ("circuit_breaker", "rate_limit", "cooldown", "mode", "maintenance")
# Only a drain counts the rack's drained nodes (blast.check_drain), so only a drain meets these two.
_DRAIN_ONLY = ("blast_radius", SCHEDULER_UNREACHABLE)


def guardrails_of(book: Any) -> tuple[str, ...]:
    """The guardrails that can stop one of this playbook's steps, in GUARDRAILS' order.

    Why not every guardrail for every playbook: a (playbook, guardrail) series that can never leave zero is
    noise in the series budget (issue 38: 8 guardrails x 24 playbooks was 192 series a tray, most of them
    impossible, such as blast_radius on a notify-only playbook). A guardrail a step can meet is exported from
    the start as before; one outside this list still appears with its first block (the counter is kept for
    every key the engine records)."""
    steps = list(getattr(book, "steps", ()))
    can = set(_EVERY_STEP) if steps else set()
    if any(s.action == "drain" for s in steps):
        can.update(_DRAIN_ONLY)
    if any(getattr(s, "approval", None) or getattr(s, "undo_approval", None) for s in steps):
        can.add("approval")
    return tuple(g for g in GUARDRAILS if g in can)
WEBHOOK_RESULTS = ("accepted", "unauthorized", "invalid", "duplicate")
IGNORED_REASONS = ("unknown_alertname", "incident_cap")

INCIDENT_OPEN = gauge("supernode_incident_open", "Open incidents (count).", ("detector", "severity"))
INCIDENTS = counter("supernode_incidents_total", "Incidents opened (count).", ("detector", "severity"))
INCIDENT_OUTCOMES = counter("supernode_incident_outcomes_total",
                            "Playbook outcomes (mitigated only when every required effect was read back).",
                            ("detector", "outcome"))
INCIDENT_DURATION = histogram("supernode_incident_duration_seconds",
                              "Duration from open to resolved of really mitigated incidents (seconds); MTTR.",
                              ("detector",))
ACTIONS = counter("supernode_remediation_actions_total", "Remediation decisions by result (count).",
                  ("playbook", "action", "result"))
BLOCKED = counter("supernode_remediation_blocked_total", "Actions stopped by a guardrail (count).",
                  ("playbook", "guardrail"))
PENDING = gauge("supernode_remediation_pending_approvals", "Steps waiting for approval (count).")
MODE = gauge("supernode_remediation_mode", "Active remediation mode (1 for the active one).", ("mode",))
BREAKER = gauge("supernode_remediation_circuit_breaker_open", "1 while the circuit breaker is open (reset by a person).")
JOURNAL_WRITABLE = gauge("supernode_journal_writable",
                         "1 while the journal's last write succeeded; 0 while rows wait in memory.")
JOURNAL_ERRORS = counter("supernode_journal_errors_total", "Failed journal write attempts (count).")
JOURNAL_PENDING = gauge("supernode_journal_pending_entries", "Journal rows accepted but not yet on disk (count).")
JOURNAL_MOVED = gauge("supernode_journal_moved_aside",
                      "1 if an unreadable journal was moved aside at this start (a fresh one opened).")
MAINTENANCE = gauge("supernode_remediation_maintenance",
                    "1 while a person has the node in maintenance (observed, not acted on).", ("node",))
COMPONENT_FAILURES = counter("supernode_component_failures_total",
                             "Component failures by class, counted from incidents (agent.reliability maps each "
                             "detector to its class); MTBF = observed component-time / failures (count).", ("class",))
COMPONENT_REPAIR = histogram("supernode_component_repair_duration_seconds",
                             "Time from a component failure's incident opening to its resolution, whoever repaired "
                             "it (seconds); MTTR per class.", ("class",))
GPU_RECOVERY_RECOMMENDED = gauge(
    "supernode_gpu_recovery_recommended",
    "1 for the recovery ladder class the GPU fault judge asks for now (app, reset, reboot, service), 0 for the "
    "others; all 0 while the GPU has no outstanding fault.", ("node", "gpu", "action"))
WEBHOOK = counter("supernode_webhook_requests_total", "Alertmanager webhook requests by result (count).", ("result",))
WEBHOOK_IGNORED = counter("supernode_webhook_alerts_ignored_total",
                          "Alerts not acted on: unknown alertname or incident cap (count).", ("reason",))


def _family(spec: MetricSpec, value: float | None = None):
    """The prometheus_client family of a spec (its exposition name without `_total`, as the library wants)."""
    labels = list(spec.labels)
    if spec.kind is Kind.COUNTER:
        name = spec.name.removesuffix("_total")
        return CounterMetricFamily(name, spec.help, value=value) if value is not None else \
            CounterMetricFamily(name, spec.help, labels=labels)
    if spec.kind is Kind.HISTOGRAM:
        return HistogramMetricFamily(spec.name, spec.help, labels=labels)
    return GaugeMetricFamily(spec.name, spec.help, value=value) if value is not None else \
        GaugeMetricFamily(spec.name, spec.help, labels=labels)


def _zeroed(counts: dict, known, zero=0) -> dict:
    out = {key: zero for key in known}
    out.update(counts)
    return dict(sorted(out.items()))


class RemediationCollector:
    def __init__(self, engine):
        self.engine = engine

    def describe(self):
        return []

    def collect(self):
        e = self.engine
        detectors = sorted(set(e.detectors.trackers) | {b.trigger.detector for b in e.playbooks if b.trigger.detector})
        open_ = _family(INCIDENT_OPEN)
        counts: dict[tuple[str, str], int] = {}
        for inc in e.incidents.open_incidents():
            counts[(inc.detector, inc.severity)] = counts.get((inc.detector, inc.severity), 0) + 1
        severity = getattr(e.detectors, "SEVERITY", {})  # a detector outside the table (a webhook alert's): both
        known = [(d, s) for d in detectors for s in ((severity[d],) if d in severity else SEVERITIES)]
        known += list(e.incidents.opened_total)
        for key, n in _zeroed(counts, known).items():
            open_.add_metric(list(key), n)
        yield open_
        total = _family(INCIDENTS)
        for key, n in _zeroed(e.incidents.opened_total, known).items():
            total.add_metric(list(key), n)
        yield total
        outcomes = _family(INCIDENT_OUTCOMES)
        for key, n in _zeroed(e.incidents.outcomes_total, [(d, o) for d in detectors for o in OUTCOMES]).items():
            outcomes.add_metric(list(key), n)
        yield outcomes
        hist = _family(INCIDENT_DURATION)
        empty = ([0] * len(DURATION_BUCKETS), 0.0, 0)
        for det, (buckets, s, c) in _zeroed(e.incidents.durations, detectors, empty).items():
            pairs = [(str(float(b)), n) for b, n in zip(DURATION_BUCKETS, buckets)] + [("+Inf", c)]
            hist.add_metric([det], pairs, s)
        yield hist
        failures = _family(COMPONENT_FAILURES)
        for (cls,), n in _zeroed({(k,): v for k, v in e.component_failures.items()}, [(c,) for c in CLASSES]).items():
            failures.add_metric([cls], n)
        yield failures
        repairs = _family(COMPONENT_REPAIR)
        for cls, (buckets, s, c) in _zeroed(e.repairs, CLASSES, empty).items():
            pairs = [(str(float(b)), n) for b, n in zip(DURATION_BUCKETS, buckets)] + [("+Inf", c)]
            repairs.add_metric([cls], pairs, s)
        yield repairs
        acts = _family(ACTIONS)
        steps = {(b.name, s.action) for b in e.playbooks for s in b.steps}
        for key, n in _zeroed(e.actions_total, [(b, a, r) for b, a in steps for r in ACTION_RESULTS]).items():
            acts.add_metric(list(key), n)
        yield acts
        blocked = _family(BLOCKED)
        for key, n in _zeroed(e.blocked_total, [(b.name, g) for b in e.playbooks for g in guardrails_of(b)]).items():
            blocked.add_metric(list(key), n)
        yield blocked
        yield _family(PENDING, len(e.pending))
        mode = _family(MODE)
        for m in MODES:
            mode.add_metric([m], 1 if m == e.mode else 0)
        yield mode
        yield _family(BREAKER, 1 if e.guard.breaker_open or e.rack.breaker_open() else 0)
        j = e.journal
        yield _family(JOURNAL_WRITABLE, 1 if j.writable else 0)
        yield _family(JOURNAL_ERRORS, j.errors_total)
        yield _family(JOURNAL_PENDING, j.pending)
        yield _family(JOURNAL_MOVED, 1 if j.moved_aside is not None else 0)
        maint = _family(MAINTENANCE)
        in_maint = e.maintenance.view()
        for node in sorted(set(e.inventory.nodes or [e.identity.node]) | set(in_maint)):
            maint.add_metric([node], 1 if node in in_maint else 0)
        yield maint
        recommended = _family(GPU_RECOVERY_RECOMMENDED)
        judge = e.detectors.gpu_faults
        for node, gpu in sorted(k for k in list(judge.gpus) if k[1]):  # (a restored node-wide fault has no GPU)
            current = judge.klass((node, gpu))
            for action in LADDER:
                recommended.add_metric([node, gpu, action], 1 if action == current else 0)
        yield recommended
        hooks = _family(WEBHOOK)
        for (r,), n in _zeroed({(k,): v for k, v in e.webhook_total.items()}, [(r,) for r in WEBHOOK_RESULTS]).items():
            hooks.add_metric([r], n)
        yield hooks
        yield from e.out_of_service.families()
        ignored = _family(WEBHOOK_IGNORED)
        for (r,), n in _zeroed({(k,): v for k, v in e.webhook_ignored.items()}, [(r,) for r in IGNORED_REASONS]).items():
            ignored.add_metric([r], n)
        yield ignored
