"""Alertmanager webhook (payload version 4): validate, match to the inventory, dedupe, record, act.

Why strict: this is the one door through which the outside asks the agent to
act. Bad input gets a 4xx (Alertmanager never retries those), a transient
fault a 5xx (it retries), and 2xx only once the engine accepted each alert;
only then is it recorded for deduplication (fingerprint + startsAt + status),
so an alert the engine refused is acted on when Alertmanager retries it. Labels only select things the
inventory names; an unknown node or device rejects the whole payload.

Why bounded: anyone holding the webhook token must not be able to grow the
agent's state. An alert is acted on only when it names a known detector (its
`detector` label or its alertname) or an alertname a playbook triggers on;
others are counted (`supernode_webhook_alerts_ignored_total`), never stored as
incidents or series. Open incidents from Alertmanager are capped; indices are
ASCII digits within the inventory; severities are a fixed set; JSON nesting and
label sizes are bounded, and all of it answers 4xx, never 500.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from exporters.validation import cut, short_repr

from .playbooks import find_playbook

TARGET_LABELS = ("node", "gpu", "zone", "port", "cdu", "pdu", "link")
SEVERITIES = ("critical", "warning", "info")
MAX_OPEN_FROM_WEBHOOK = 1000  # open incidents opened by Alertmanager; more are counted, not stored
MAX_LABELS = 64
MAX_LABEL_CHARS = 1024
MAX_INDEX_DIGITS = 4


class WebhookError(Exception):
    def __init__(self, status: int, result: str, message: str):
        super().__init__(message)
        self.status = status
        self.result = result


Labels = Annotated[dict[Annotated[str, Field(max_length=MAX_LABEL_CHARS)],
                         Annotated[str, Field(max_length=MAX_LABEL_CHARS)]], Field(max_length=MAX_LABELS)]


class Alert(BaseModel):
    model_config = ConfigDict(extra="allow")  # newer Alertmanagers add optional fields

    status: str = Field(pattern="^(firing|resolved)$")
    labels: Labels
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
        raise WebhookError(400, "invalid", f"body is not JSON: {str(exc)[:200]}") from None
    except RecursionError:
        raise WebhookError(400, "invalid", "body is nested too deeply") from None
    if not isinstance(data, dict):
        raise WebhookError(400, "invalid", "body must be a JSON object")
    if data.get("version") != "4":
        raise WebhookError(400, "invalid", f"unsupported payload version {data.get('version')!r} (want \"4\")")
    try:
        return Payload.model_validate(data)
    except RecursionError:
        raise WebhookError(400, "invalid", "body is nested too deeply") from None
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        raise WebhookError(422, "invalid", cut(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")) from None


def targets_for(alert: Alert, identity: Any, inventory: Any) -> dict[str, str]:
    """Target labels checked against the inventory; raises 422 naming the unknown one."""
    lab = alert.labels
    if "alertname" not in lab:
        raise WebhookError(422, "invalid", "alert without alertname label")
    if "rack" in lab and lab["rack"] != identity.rack:
        raise WebhookError(422, "invalid", f"rack {short_repr(lab['rack'])} is not this rack ({identity.rack})")
    limits = {"gpu": inventory.gpus.count or 10 ** MAX_INDEX_DIGITS,
              "link": inventory.gpus.nvlinks_per_gpu or 10 ** MAX_INDEX_DIGITS}
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
            raise WebhookError(422, "invalid", f"{key} {short_repr(value)} is not in the inventory")
        if key in limits:
            # ASCII digits only: str.isdigit() also takes "²" and Arabic-Indic digits, which int() then
            # reads differently or not at all.
            if not (value.isascii() and value.isdigit() and len(value) <= MAX_INDEX_DIGITS):
                raise WebhookError(422, "invalid", f"{key} {short_repr(value)} is not an index")
            if int(value) >= limits[key]:
                raise WebhookError(422, "invalid", f"{key} {value} is not in the inventory (< {limits[key]})")
            value = str(int(value))  # "01" and "1" are one GPU
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


def known_names(engine: Any) -> set[str]:
    """Incident names an alert may open: the local detectors and what the playbooks trigger on."""
    names = set(engine.detectors.trackers)
    for book in engine.playbooks:
        names.update(n for n in (book.trigger.detector, book.trigger.alertname) if n)
    return names


def _ignore_reason(engine: Any, alert: Alert, name: str, targets: dict[str, str], known: set[str]) -> str | None:
    if name not in known:
        return "unknown_alertname"
    if (alert.status == "firing" and engine.incidents.find(name, targets) is None
            and sum(i.source == "alertmanager" for i in engine.incidents.open_incidents()) >= MAX_OPEN_FROM_WEBHOOK):
        return "incident_cap"
    return None


def handle_payload(engine: Any, body: bytes) -> dict[str, Any]:
    """Validate all alerts first (no partial action on a bad payload), then record and dispatch each."""
    payload = parse_payload(body)
    checked = [(a, targets_for(a, engine.identity, engine.inventory)) for a in payload.alerts]
    known = known_names(engine)
    accepted = duplicates = ignored = 0
    for alert, targets in checked:
        name = incident_name(engine, alert, targets)
        reason = _ignore_reason(engine, alert, name, targets, known)
        if reason is not None:
            engine.count_webhook_ignored(reason)
            ignored += 1
            continue
        key = (fingerprint(alert), alert.startsAt, alert.status)
        try:
            seen = engine.journal.alert_seen(*key)
        except Exception as exc:  # the journal cannot even be opened: transient, let Alertmanager retry
            raise WebhookError(503, "error", f"journal unavailable: {exc}") from None
        if seen:
            duplicates += 1
            continue
        try:
            if alert.status == "firing":
                severity = alert.labels.get("severity", "warning")
                engine.fire(name, targets, severity if severity in SEVERITIES else "warning", "alertmanager",
                            {"fingerprint": key[0], "summary": alert.annotations.get("summary", "")})
            else:
                engine.clear(name, targets)
        except Exception as exc:  # not accepted: not recorded either, so Alertmanager's retry acts
            raise WebhookError(503, "error", f"alert {short_repr(name)} not accepted: {exc}") from None
        # Deduplicated only now that the engine holds it (Alertmanager delivers at least once).
        engine.journal.record_alert(*key)
        accepted += 1
    return {"accepted": accepted, "duplicates": duplicates, "ignored": ignored}
