"""The drill's HTTP routes (on the agent's listener, the agent's own token check) and the CLI behind them.

Why over the API: the drill runs inside the agent (its snapshot, its engine); `supernode-agent drill PLAN`
validates the plan locally, hands it to the running agent as `approve` and `incidents` do, and prints the
report once the drill has ended.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # aiohttp.web at import would load the system MIME database before agent.memory skips it
    from aiohttp import web

from agent.auth import TokenSource, caller, requires_admin, token_map
from exporters.validation import terminal_safe

from .plan import PlanError, load_plan, parse_plan
from .report import format_markdown, format_text
from .runner import DrillRefused, DrillRunner

ENDED = ("passed", "failed", "aborted", "ended")


def add_drill_routes(app: web.Application, runner: DrillRunner, admin_token: TokenSource) -> None:
    from aiohttp import web

    admin = requires_admin(admin_token)

    @admin
    async def start(request: web.Request, who: str) -> web.Response:
        try:
            body = await request.json()
            if not isinstance(body, dict) or not isinstance(body.get("allow_jobs", False), bool):
                raise PlanError("body: expected {plan: {...}, allow_jobs: true|false}")
            plan = parse_plan(body.get("plan"), "plan")
            # the admin token's name (under mTLS `who` holds the certificate subject too): it signs the drill's
            # announcement to the other agents of its zone (agent/drill/records.py)
            token = next((n for n, t in token_map(admin_token).items() if caller(request, {n: t}) is not None), None)
            view = await runner.start(plan, who, body.get("allow_jobs", False), token)
        except (PlanError, json.JSONDecodeError, ValueError) as exc:
            return web.json_response({"error": terminal_safe(str(exc), keep="\n")}, status=400)
        except DrillRefused as exc:
            return web.json_response({"error": terminal_safe(str(exc), keep="\n")}, status=409)
        return web.json_response(view)

    @admin
    async def view(request: web.Request, who: str) -> web.Response:
        return web.json_response(runner.view())

    @admin
    async def abort(request: web.Request, who: str) -> web.Response:
        return web.json_response(await runner.abort(who))

    app.router.add_post("/api/v1/drill", start)
    app.router.add_get("/api/v1/drill", view)
    app.router.add_post("/api/v1/drill/abort", abort)


def cli_drill(url: str, token_file: str | None, plan_path: str | None, allow_jobs: bool, fmt: str,
              abort: bool, wait: float) -> int:
    """`drill PLAN`: start it, wait for its end, print the report (exit 0 only when every stage passed)."""
    from agent.remediation.api import _call

    if not token_file:
        print("supernode-agent drill: no admin token (pass --token-file)", file=sys.stderr)
        return 2
    if abort:
        data = _call(url, "/api/v1/drill/abort", token_file, method="POST")
        if isinstance(data, int):
            return data
        print(f"drill: abort asked ({data.get('state')}); resolved {', '.join(data.get('resolved', [])) or '-'}; "
              f"undo approved for {', '.join(data.get('resolved', []) + data.get('undoing', [])) or '-'}")
        return 0 if data.get("state") != "idle" or data.get("resolved") or data.get("undoing") else 1
    if not plan_path:
        print("supernode-agent drill: which plan? (a YAML file, see examples/drill-leak.yaml)", file=sys.stderr)
        return 2
    try:
        plan = load_plan(plan_path)
    except PlanError as exc:
        print(terminal_safe(str(exc), keep="\n"), file=sys.stderr)
        return 2
    data = _call(url, "/api/v1/drill", token_file, method="POST",
                 body={"plan": plan.model_dump(mode="json"), "allow_jobs": allow_jobs})
    if isinstance(data, int):
        return data
    deadline = time.monotonic() + wait
    while data.get("state") not in ENDED and time.monotonic() < deadline:
        time.sleep(0.5)
        got = _call(url, "/api/v1/drill", token_file)
        if isinstance(got, int):
            return got
        data = got
    rep: dict[str, Any] = data.get("report") or {}
    if fmt == "json":
        print(json.dumps(data, indent=2))
    elif fmt == "markdown":
        sys.stdout.write(terminal_safe(format_markdown(rep), keep="\n"))
    else:
        sys.stdout.write(terminal_safe(format_text(rep), keep="\n"))
    if data.get("state") not in ENDED:
        print(f"drill {plan.name}: still {data.get('state')} after {wait:g} s (its report so far above; "
              "`drill --abort` ends it)", file=sys.stderr)
        return 1
    return 0 if rep.get("passed") and data.get("state") == "passed" else 1
