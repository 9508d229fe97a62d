"""The agent's endpoint for Redfish push subscriptions: POST /api/v1/redfish/events/<name>.

Why on the agent's own listener: a BMC without SSE delivers events by POSTing
them to a subscriber's URL. The agent subscribes with that URL and a bearer
token the BMC sends back in `HttpHeaders`: the service's own
(inventory.redfish.N.event_token_secret), else the shared
sources.redfish.event_token_secret. A delivery is checked against the token of
the service its path names, and only that one: BMC A's token is refused (401)
on BMC B's path, so one compromised BMC cannot push in another's name. A
delivery only asks its source for a poll, coalesced per service (EventWatch):
nothing in its body is acted on by itself (the poll reads the detectors again).
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from agent.context import AgentContext
from agent.auth import caller, token_map, unauthorized
from agent.sources import push_token_secret
from exporters.validation import terminal_safe

log = logging.getLogger("supernode.redfish")
MAX_EVENT_BYTES = 256 << 10
PATH = "/api/v1/redfish/events/{name}"


def mount(agent: AgentContext):
    """A route mount (agent.route_mounts) reading the running config at each request (token rotation, reload)."""

    def add(app: web.Application) -> None:
        async def push(request: web.Request) -> web.Response:
            cfg = agent.loaded.config
            service = request.match_info["name"]
            ep = next((e for e in cfg.inventory.redfish if e.name == service), None)
            name = push_token_secret(cfg, ep) if ep is not None else None
            token = agent.loaded.secrets.get(name) if name else None
            if token is None:
                return web.json_response({"error": "push delivery is not configured for this service "
                                                   "(inventory.redfish.N.event_token_secret or "
                                                   "sources.redfish.event_token_secret)"}, status=404)
            if caller(request, token_map(token, "redfish")) is None:
                log.warning("redfish event delivery refused: bad or missing token for this service",
                            extra={"service": terminal_safe(service), "remote": request.remote})
                return unauthorized()
            runner = agent.scheduler.runners.get(f"redfish/{service}")
            if runner is None or not hasattr(runner.source, "push_received"):
                return web.json_response({"error": "no such Redfish service polled here"}, status=404)
            if (request.content_length or 0) > MAX_EVENT_BYTES:
                return web.json_response({"error": f"body over {MAX_EVENT_BYTES} bytes"}, status=413)
            try:
                body = await request.read()  # the listener bounds size (client_max_size) and time
            except web.HTTPRequestEntityTooLarge:
                return web.json_response({"error": "body too large"}, status=413)
            if len(body) > MAX_EVENT_BYTES:
                return web.json_response({"error": f"body over {MAX_EVENT_BYTES} bytes"}, status=413)
            try:
                payload = json.loads(body)
            except (ValueError, RecursionError):
                return web.json_response({"error": "body is not JSON"}, status=400)
            if not isinstance(payload, dict):
                return web.json_response({"error": "body is not a JSON object (a Redfish Event)"}, status=400)
            runner.source.push_received(payload)
            return web.Response(status=204)

        app.router.add_post(PATH, push)

    return add
