"""HTTP routes (webhook, incidents, approve, journal, breaker reset) and the CLI helpers behind them.

Why here: the runtime owns the server (TLS, client certs, listen address);
this module only mounts routes on the app it is given, so the same routes
run in tests on a loopback port. Every token check is agent.auth's.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from aiohttp import web

from agent.auth import Flag, TokenSource, caller, requires_admin, token_map, unauthorized
from agent.httpclient import request_json
from exporters.validation import terminal_safe

from .decisions import log_webhook_rejection
from .approvals import AmbiguousApproval
from .journal import Journal
from .webhook import WebhookError, handle_payload


MAX_JOURNAL_LIMIT = 5000


def journal_limit(raw: str | None, default: int = 200) -> int:
    """`?limit=`: a plain decimal integer 1..MAX_JOURNAL_LIMIT (ValueError naming the rule otherwise)."""
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not 1 <= int(raw) <= MAX_JOURNAL_LIMIT:
        raise ValueError(f"limit must be an integer from 1 to {MAX_JOURNAL_LIMIT}")
    return int(raw)


def _reject(request: web.Request, engine, status: int, result: str, why: str, **kw) -> web.Response:
    """A refused webhook delivery: counted, logged with its peer and reason, answered."""
    engine.count_webhook(result)
    log_webhook_rejection(status, result, why, request.remote)
    return web.json_response({"error": why}, status=status, **kw)


def add_remediation_routes(app: web.Application, engine, admin_token: TokenSource,
                           webhook_token: TokenSource, max_body: int, open_reads: Flag = False) -> None:
    """Mount the routes. `admin_token`: name -> token (or one token, or a callable, see agent.auth);
    `open_reads`: serve incidents and the journal without a token (config auth.open_reads)."""
    admin = requires_admin(admin_token)
    reader = requires_admin(admin_token, open_reads)

    def too_large(request: web.Request) -> web.Response:
        return _reject(request, engine, 413, "invalid", f"body over {max_body} bytes")

    async def alerts(request: web.Request) -> web.Response:
        if caller(request, token_map(webhook_token, "webhook")) is None:
            engine.count_webhook("unauthorized")
            log_webhook_rejection(401, "unauthorized", "unauthorized", request.remote)
            return unauthorized()
        if request.content_length is not None and request.content_length > max_body:
            return too_large(request)
        try:
            body = await request.read()  # the listener bounds its size (client_max_size) and time
        except web.HTTPRequestEntityTooLarge:
            return too_large(request)
        if len(body) > max_body:
            return too_large(request)
        try:
            out = handle_payload(engine, body)
        except WebhookError as exc:
            return _reject(request, engine, exc.status, exc.result, str(exc))
        engine.count_webhook("accepted" if out["accepted"] else "duplicate")
        return web.json_response(out, status=200)

    @reader
    async def incidents(request: web.Request, who: str) -> web.Response:
        return web.json_response(engine.incidents_view())

    @admin
    async def approve(request: web.Request, who: str) -> web.Response:
        """One step by its id; an incident's one pending step; several only with `?all=true` (409 lists them)."""
        flag = request.query.get("all", "false").lower()
        if flag not in ("true", "false", "1", "0"):
            return web.json_response({"error": "all must be true or false"}, status=400)
        # the admin token's name (under mTLS `who` is the certificate subject): it keys a rack approval's proof
        token = next((n for n, t in token_map(admin_token).items() if caller(request, {n: t}) is not None), None)
        try:
            done = await engine.approve_anywhere(request.match_info["id"], who=who, all_=flag in ("true", "1"),
                                                 token=token)
        except AmbiguousApproval as exc:
            return web.json_response({"error": f"{len(exc.steps)} steps pending under this incident: approve one "
                                               "by its id, or all of them with all=true", "pending": exc.steps},
                                     status=409)
        if not done:
            return web.json_response({"error": "nothing pending under that id"}, status=404)
        return web.json_response({"approved": done, "by": token or who})

    @reader
    async def journal(request: web.Request, who: str) -> web.Response:
        try:
            limit = journal_limit(request.query.get("limit"))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        # a read of the file: on a thread, so a slow state disk never holds the event loop
        rows = [_entry_dict(e) for e in await asyncio.to_thread(engine.journal.entries, limit=limit)]
        return web.json_response({"entries": rows})

    @admin
    async def breaker_reset(request: web.Request, who: str) -> web.Response:
        return web.json_response({"was_open": engine.reset_breaker(who=who), "by": who})

    @admin
    async def close(request: web.Request, who: str) -> web.Response:
        reject = request.match_info["verb"] == "reject"
        inc = engine.close_by_person(request.match_info["id"], who, reject=reject)
        if inc is None:
            return web.json_response({"error": "no open incident under that id"}, status=404)
        return web.json_response({"id": inc.id, "state": inc.state, "resolution": inc.detail.get("resolution"),
                                  "by": inc.detail.get("closed_by")})

    @reader
    async def maintenance_get(request: web.Request, who: str) -> web.Response:
        return web.json_response({"maintenance": engine.maintenance.view()})

    @admin
    async def maintenance_set(request: web.Request, who: str) -> web.Response:
        try:
            body = await request.json()
            node = body.get("node") or engine.identity.node
            on, until = body["on"], body.get("until")
            if not isinstance(node, str) or not isinstance(on, bool) or not (
                    until is None or isinstance(until, (int, float))):
                raise ValueError("node must be a string, on a boolean, until a number (epoch seconds) or null")
            if node not in (engine.inventory.nodes or [engine.identity.node]):
                raise ValueError(f"node: {node!r} is not in this rack's inventory")
            view = engine.maintenance.set(node, on, who, until)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return web.json_response({"error": f"bad maintenance request: {terminal_safe(str(exc))}"}, status=400)
        return web.json_response({"maintenance": view})

    app.router.add_post("/api/v1/alerts", alerts)
    app.router.add_get("/api/v1/incidents", incidents)
    app.router.add_post("/api/v1/incidents/{id}/approve", approve)
    app.router.add_get("/api/v1/journal", journal)
    app.router.add_post("/api/v1/breaker/reset", breaker_reset)
    app.router.add_post(r"/api/v1/incidents/{id}/{verb:resolve|reject}", close)
    app.router.add_get("/api/v1/maintenance", maintenance_get)
    app.router.add_post("/api/v1/maintenance", maintenance_set)


def _entry_dict(e) -> dict:
    return {f: getattr(e, f) for f in e.__slots__}


# -- CLI helpers (agent/cli.py calls these) -------------------------------------

def _request(base_url: str, path: str, token_file: Path | str | None, method: str = "GET",
             body: dict | None = None) -> tuple[int, dict] | int:
    """(status, answer) from the agent, or the CLI's exit code after printing why it could not be reached."""
    token = Path(token_file).read_text().strip() if token_file else None
    try:
        status, data = request_json(method, base_url.rstrip("/") + path, body, token=token)
    except OSError as exc:
        print(f"error: cannot reach {base_url}: {exc}", file=sys.stderr)
        return 2
    return status, data if isinstance(data, dict) else {}


def _call(base_url: str, path: str, token_file: Path | str | None, method: str = "GET",
          body: dict | None = None, also: tuple[int, ...] = ()) -> dict | int:
    """The agent's answer as a dict (status 200, or one of `also`), or the CLI's exit code after printing why
    there is none."""
    got = _request(base_url, path, token_file, method, body)
    if isinstance(got, int):
        return got
    status, data = got
    if status != 200 and status not in also:
        print(f"error: {status} {terminal_safe(data.get('error', ''))}", file=sys.stderr)
        return 1
    return data


def _fmt_ts(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _table(rows: list[list[str]], out=None) -> None:
    out = out or sys.stdout
    if not rows:
        return
    rows = [[terminal_safe(c) for c in r] for r in rows]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip(), file=out)


def cli_incidents(base_url: str, token_file: Path | str | None) -> int:
    data = _call(base_url, "/api/v1/incidents", token_file)
    if isinstance(data, int):
        return data
    rows = [["ID", "DETECTOR", "TARGETS", "SEVERITY", "STATE", "OPENED", "DURATION_S", "PLAYBOOK"]]
    for inc in data["open"] + list(reversed(data["recent"])):
        rows.append([inc["id"], inc["detector"], ",".join(f"{k}={v}" for k, v in sorted(inc["targets"].items())),
                     inc["severity"], inc["state"], _fmt_ts(inc["opened_at"]), f"{inc['duration_seconds']:.1f}",
                     inc.get("playbook") or "-"])
    print(f"mode: {terminal_safe(data['mode'])}   circuit breaker: {'OPEN' if data['breaker_open'] else 'closed'}")
    for node, m in data.get("maintenance", {}).items():
        print(terminal_safe(f"maintenance: {node} (by {m['by']}, set on {m.get('set_via', '?')}, "
                            f"until {_fmt_ts(m['until'])})"))
    _table(rows)
    if data["pending_approvals"]:
        print("\npending approvals (supernode-agent approve ID):")
        _table([["ID", "INCIDENT", "ACTION", "TARGET", "PHASE", "EXPIRES"]] +
               [[p["id"], p["incident_id"], p["action"], p["target"], p["phase"], _fmt_ts(p["expires_at"])]
                for p in data["pending_approvals"]])
        _print_dry_history(data["pending_approvals"])
    return 0


def _print_dry_history(pending: list[dict]) -> None:
    """Under a resume after a leak: each detector of its scope, when it last read wet, how long it has been dry."""
    for p in (p for p in pending if "dry_history" in p):
        print(terminal_safe(f"\n{p['id']}: leak scope {p.get('leak_scope')}, dry hold {p.get('dry_hold_seconds'):g} s "
                            + ("passed" if p.get("dry_hold_passed") else "NOT passed")))
        _table([["DETECTOR", "ZONE", "STATE", "LAST_WET", "DRY_SINCE", "DRY_S"]] +
               [[r["sensor"], r["zone"], r["state"], _fmt_ts(r["last_wet_at"]), _fmt_ts(r["dry_since"]),
                 f"{r['dry_seconds']:.0f}"] for r in p["dry_history"]])


def cli_approve(base_url: str, incident_or_action_id: str, token_file: Path | str, all_: bool = False) -> int:
    """Approve one step (by its id), an incident's one pending step, or with --all every pending step of it;
    an incident with several pending steps and no --all: print them and ask which (exit 1)."""
    query = "?all=true" if all_ else ""
    data = _call(base_url, f"/api/v1/incidents/{incident_or_action_id}/approve{query}", token_file, method="POST",
                 also=(409,))
    if isinstance(data, int):
        return data
    if "pending" in data:
        print(f"{terminal_safe(incident_or_action_id)} has several pending steps; approve one by its ID "
              "(supernode-agent approve ID), or all of them with --all:", file=sys.stderr)
        _table([["ID", "ACTION", "TARGET", "PHASE"]] +
               [[str(p.get("id")), str(p.get("action")), str(p.get("target")), str(p.get("phase"))]
                for p in data["pending"] if isinstance(p, dict)], out=sys.stderr)
        return 1
    for aid in data.get("approved", []):
        print(f"approved {terminal_safe(aid)}" + (" (--all)" if all_ else ""))
    return 0


def cli_close(base_url: str, verb: str, incident_id: str, token_file: Path | str) -> int:
    data = _call(base_url, f"/api/v1/incidents/{incident_id}/{verb}", token_file, method="POST")
    if isinstance(data, int):
        return data
    print(f"{data['id']} {data['resolution']} by {data['by']}")
    return 0


def cli_maintenance(base_url: str, state: str, node: str | None, until: float | None, token_file: Path | str) -> int:
    if state == "status":
        data = _call(base_url, "/api/v1/maintenance", token_file)
    else:
        data = _call(base_url, "/api/v1/maintenance", token_file, method="POST",
                     body={"node": node, "on": state == "on", "until": until})
    if isinstance(data, int):
        return data
    rows = [["NODE", "BY", "SET_ON", "SINCE", "UNTIL"]] + [
        [n, m["by"], m.get("set_via", "?") + ("" if m.get("local", True) else " (rack)"), _fmt_ts(m["since"]),
         _fmt_ts(m["until"])] for n, m in data["maintenance"].items()]
    print("nodes in maintenance:" if len(rows) > 1 else "no node in maintenance")
    _table(rows if len(rows) > 1 else [])
    return 0


def read_journal(path: Path | str, limit: int | None = None) -> list | None:
    """The journal's rows, read read-only from a state dir (journal.db inside) or the db file itself;
    None, after saying so, when there is none (works with the agent down)."""
    path = Path(path)
    if path.is_dir():
        path = path / "journal.db"
    if not path.exists():
        print(f"error: no journal at {path}", file=sys.stderr)
        return None
    j = Journal(path, readonly=True)
    try:
        return j.entries(limit=limit)
    finally:
        j.close()


def cli_journal(path: Path | str, limit: int = 100) -> int:
    entries = read_journal(path, limit)
    if entries is None:
        return 1
    rows = [["SEQ", "TIME", "KIND", "RESULT", "PLAYBOOK", "ACTION", "TARGET", "INCIDENT", "DETAIL"]]
    for e in entries:
        detail = e.detail.get("guardrail") or e.detail.get("message") or e.detail.get("error") or ""
        rows.append([str(e.seq), _fmt_ts(e.ts), e.kind, e.result or "-", e.playbook or "-", e.action or "-",
                     e.target or "-", e.incident_id or "-", str(detail)[:60]])
    _table(rows)
    return 0
