"""The prometheus_client collector for incidents and remediation (names per METRICS.md).

Why a custom collector: the values live in the engine (incident book,
counters); `collect()` renders them fresh on each scrape and is registered
on the agent's explicit registry, never the global one.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .incidents import DURATION_BUCKETS

MODES = ("observe", "dry-run", "enforce")


class RemediationCollector:
    def __init__(self, engine):
        self.engine = engine

    def describe(self):
        return []

    def collect(self):
        e = self.engine
        open_ = GaugeMetricFamily("supernode_incident_open", "Open incidents (count).", labels=["detector", "severity"])
        counts: dict[tuple[str, str], int] = {}
        for inc in e.incidents.open_incidents():
            counts[(inc.detector, inc.severity)] = counts.get((inc.detector, inc.severity), 0) + 1
        for key in e.incidents.opened_total:
            counts.setdefault(key, 0)
        for key, n in sorted(counts.items()):
            open_.add_metric(list(key), n)
        yield open_
        total = CounterMetricFamily("supernode_incidents", "Incidents opened (count).", labels=["detector", "severity"])
        for key, n in sorted(e.incidents.opened_total.items()):
            total.add_metric(list(key), n)
        yield total
        outcomes = CounterMetricFamily("supernode_incident_outcomes",
                                       "Playbook outcomes (mitigated only when every required effect was read back).",
                                       labels=["detector", "outcome"])
        for key, n in sorted(e.incidents.outcomes_total.items()):
            outcomes.add_metric(list(key), n)
        yield outcomes
        hist = HistogramMetricFamily("supernode_incident_duration_seconds",
                                     "Duration from open to resolved of really mitigated incidents (seconds); MTTR.",
                                     labels=["detector"])
        for det, (buckets, s, c) in sorted(e.incidents.durations.items()):
            pairs = [(str(float(b)), n) for b, n in zip(DURATION_BUCKETS, buckets)] + [("+Inf", c)]
            hist.add_metric([det], pairs, s)
        yield hist
        acts = CounterMetricFamily("supernode_remediation_actions", "Remediation decisions by result (count).",
                                   labels=["playbook", "action", "result"])
        for key, n in sorted(e.actions_total.items()):
            acts.add_metric(list(key), n)
        yield acts
        blocked = CounterMetricFamily("supernode_remediation_blocked", "Actions stopped by a guardrail (count).",
                                      labels=["playbook", "guardrail"])
        for key, n in sorted(e.blocked_total.items()):
            blocked.add_metric(list(key), n)
        yield blocked
        yield GaugeMetricFamily("supernode_remediation_pending_approvals", "Steps waiting for approval (count).",
                                value=len(e.pending))
        mode = GaugeMetricFamily("supernode_remediation_mode", "Active remediation mode (1 for the active one).",
                                 labels=["mode"])
        for m in MODES:
            mode.add_metric([m], 1 if m == e.mode else 0)
        yield mode
        yield GaugeMetricFamily("supernode_remediation_circuit_breaker_open",
                                "1 while the circuit breaker is open (reset by a person).",
                                value=1 if e.guard.breaker_open else 0)
        j = e.journal
        yield GaugeMetricFamily("supernode_journal_writable",
                                "1 while the journal's last write succeeded; 0 while rows wait in memory.",
                                value=1 if j.writable else 0)
        yield CounterMetricFamily("supernode_journal_errors", "Failed journal write attempts (count).",
                                  value=j.errors_total)
        yield GaugeMetricFamily("supernode_journal_pending_entries",
                                "Journal rows accepted but not yet on disk (count).", value=j.pending)
        yield GaugeMetricFamily("supernode_journal_moved_aside",
                                "1 if an unreadable journal was moved aside at this start (a fresh one opened).",
                                value=1 if j.moved_aside is not None else 0)
        maint = GaugeMetricFamily("supernode_remediation_maintenance",
                                  "1 while a person has the node in maintenance (observed, not acted on).",
                                  labels=["node"])
        in_maint = e.maintenance.view()
        for node in sorted(set(e.inventory.nodes or [e.identity.node]) | set(in_maint)):
            maint.add_metric([node], 1 if node in in_maint else 0)
        yield maint
        hooks = CounterMetricFamily("supernode_webhook_requests", "Alertmanager webhook requests by result (count).",
                                    labels=["result"])
        for r in ("accepted", "unauthorized", "invalid", "duplicate"):
            hooks.add_metric([r], e.webhook_total.get(r, 0))
        for r, n in sorted(e.webhook_total.items()):
            if r not in ("accepted", "unauthorized", "invalid", "duplicate"):
                hooks.add_metric([r], n)
        yield hooks
        ignored = CounterMetricFamily("supernode_webhook_alerts_ignored",
                                      "Alerts not acted on: unknown alertname or incident cap (count).",
                                      labels=["reason"])
        for r in ("unknown_alertname", "incident_cap"):
            ignored.add_metric([r], e.webhook_ignored.get(r, 0))
        yield ignored
