"""Alertmanager webhook (payload version 4): validate, match to the inventory, dedupe, record, act.

Why strict: this is the one door through which the outside asks the agent to
act. Bad input gets a 4xx (Alertmanager never retries those), a transient
fault a 5xx (it retries), and 2xx only once the engine accepted each alert;
only then is it recorded for deduplication (fingerprint + startsAt + status),
so an alert the engine refused is acted on when Alertmanager retries it. Labels only select things the
inventory names; an unknown node or device rejects the whole payload.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .playbooks import find_playbook

TARGET_LABELS = ("node", "gpu", "zone", "port", "cdu", "pdu", "link")


class WebhookError(Exception):
    def __init__(self, status: int, result: str, message: str):
        super().__init__(message)
        self.status = status
        self.result = result


class Alert(BaseModel):
    model_config = ConfigDict(extra="allow")  # newer Alertmanagers add optional fields

    status: str = Field(pattern="^(firing|resolved)$")
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str
    endsAt: str | None = None
    generatorURL: str | None = None
    fingerprint: str | None = None


class Payload(BaseModel):
    model_config = ConfigDict(extra="allow")

    version: str
    status: str = Field(pattern="^(firing|resolved)$")
    receiver: str = ""
    groupKey: str = ""
    truncatedAlerts: int = 0
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[Alert] = Field(max_length=1000)


def parse_payload(body: bytes) -> Payload:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WebhookError(400, "invalid", f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WebhookError(400, "invalid", "body must be a JSON object")
    if data.get("version") != "4":
        raise WebhookError(400, "invalid", f"unsupported payload version {data.get('version')!r} (want \"4\")")
    try:
        return Payload.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        raise WebhookError(422, "invalid", f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None


def targets_for(alert: Alert, identity: Any, inventory: Any) -> dict[str, str]:
    """Target labels checked against the inventory; raises 422 naming the unknown one."""
    lab = alert.labels
    if "alertname" not in lab:
        raise WebhookError(422, "invalid", "alert without alertname label")
    if "rack" in lab and lab["rack"] != identity.rack:
        raise WebhookError(422, "invalid", f"rack {lab['rack']!r} is not this rack ({identity.rack})")
    known = {
        "node": set(inventory.nodes) | {identity.node},
        "zone": {z.name for z in inventory.leak_zones},
        "port": {p.name for p in inventory.ports},
        "cdu": {c.name for c in inventory.cdus},
        "pdu": {p.name for p in inventory.pdus},
    }
    targets: dict[str, str] = {}
    for key in TARGET_LABELS:
        if key not in lab:
            continue
        value = lab[key]
        if key in known and value not in known[key]:
            raise WebhookError(422, "invalid", f"{key} {value!r} is not in the inventory")
        if key in ("gpu", "link") and not value.isdigit():
            raise WebhookError(422, "invalid", f"{key} {value!r} is not an index")
        targets[key] = value
    if not targets:
        targets["rack"] = identity.rack
    return targets


def fingerprint(alert: Alert) -> str:
    if alert.fingerprint:
        return alert.fingerprint
    return hashlib.sha256(json.dumps(sorted(alert.labels.items())).encode()).hexdigest()[:16]


def incident_name(engine: Any, alert: Alert, targets: dict[str, str]) -> str:
    """The shipped rules label each alert with the local detector it mirrors (`detector`): the delivery
    lands in that detector's incident and playbook, as a local detection would. A playbook keyed on
    the alertname itself still wins; an alert without a `detector` label is keyed by its alertname."""
    name = alert.labels["alertname"]
    detector = alert.labels.get("detector")
    if detector and find_playbook(engine.playbooks, name, targets) is None:
        return detector
    return name


def handle_payload(engine: Any, body: bytes) -> dict[str, Any]:
    """Validate all alerts first (no partial action on a bad payload), then record and dispatch each."""
    payload = parse_payload(body)
    checked = [(a, targets_for(a, engine.identity, engine.inventory)) for a in payload.alerts]
    accepted = duplicates = 0
    for alert, targets in checked:
        key = (fingerprint(alert), alert.startsAt, alert.status)
        try:
            seen = engine.journal.alert_seen(*key)
        except Exception as exc:  # the journal cannot even be opened: transient, let Alertmanager retry
            raise WebhookError(503, "error", f"journal unavailable: {exc}") from None
        if seen:
            duplicates += 1
            continue
        name = incident_name(engine, alert, targets)
        try:
            if alert.status == "firing":
                engine.fire(name, targets, alert.labels.get("severity", "warning"), "alertmanager",
                            {"fingerprint": key[0], "summary": alert.annotations.get("summary", "")})
            else:
                engine.clear(name, targets)
        except Exception as exc:  # not accepted: not recorded either, so Alertmanager's retry acts
            raise WebhookError(503, "error", f"alert {alert.labels['alertname']} not accepted: {exc}") from None
        # Deduplicated only now that the engine holds it (Alertmanager delivers at least once).
        engine.journal.record_alert(*key)
        accepted += 1
    return {"accepted": accepted, "duplicates": duplicates}
