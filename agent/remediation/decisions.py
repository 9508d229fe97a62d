"""Decision log: every journaled decision also becomes one structured log line.

Why: the journal is the durable record, but an SRE at 3 a.m. reads the
agent's log (journalctl) first. Each intent, result, block (with its why in
words), approval, breaker reset, incident transition, maintenance change and
health check is one line with the same ids as the journal row, so the log of
a leak reads as a timeline: opened -> cap intent/done -> drain intent/done ->
valve pending -> approved by whom -> valve done. Webhook rejections are logged
where they happen (api.py) with `log_webhook_rejection`.
"""

from __future__ import annotations

import logging
from typing import Any

from .journal import Journal

log = logging.getLogger("supernode.decision")

# LogRecord attributes a detail key must not overwrite
_RENAMED = {"message": "outcome"}
_BAD_RESULTS = ("failed", "blocked", "expired", "rejected")
_DETAIL_KEYS = ("guardrail", "why", "error", "message", "by", "approved_by", "approved_via", "phase", "approval",
                "reason", "until", "check", "mode", "restored_incidents", "reconciled", "held_by")


def _event(kind: str, action: str | None, result: str | None) -> str:
    """The line's `event`: what happened, in words (`drain blocked`, `incident mitigating`, `approval pending`)."""
    if kind in ("intent", "result", "blocked"):
        return f"{action or '?'} {'intent' if kind == 'intent' else result or kind}"
    return f"{kind} {result}" if result else kind


def log_entry(kind: str, fields: dict[str, Any]) -> None:
    detail = fields.get("detail") or {}
    result = fields.get("result")
    extra: dict[str, Any] = {"decision": kind}
    for key in ("incident_id", "playbook", "action", "target", "action_id", "result"):
        if fields.get(key) is not None:
            extra[key] = fields[key]
    for key in _DETAIL_KEYS:
        if key in detail and detail[key] not in (None, "", [], {}):
            extra[_RENAMED.get(key, key)] = detail[key]
    if kind == "incident":
        for key in ("detector", "severity", "source"):
            if key in detail:
                extra[key] = detail[key]
    level = logging.WARNING if (result in _BAD_RESULTS or kind == "blocked") else logging.INFO
    log.log(level, _event(kind, fields.get("action"), result), extra=extra)


class LoggedJournal(Journal):
    """A Journal whose every append is also one decision log line (after it is durable)."""

    def append(self, kind: str, **fields: Any) -> int:  # type: ignore[override]
        seq = super().append(kind, **fields)
        try:
            log_entry(kind, fields)
        except Exception:  # a log line must never undo a journaled decision
            log.exception("decision log line failed", extra={"decision": kind})
        return seq


def log_webhook_rejection(status: int, result: str, why: str, peer: str | None) -> None:
    """One line per refused Alertmanager delivery (401, 413, 422...): who sent it and why it was refused."""
    log.warning("webhook rejected", extra={"decision": "webhook", "status": status, "result": result, "why": why,
                                           "peer": peer or "-"})
