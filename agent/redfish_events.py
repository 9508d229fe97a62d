"""The agent's endpoint for Redfish push subscriptions: POST /api/v1/redfish/events/<name>.

Why on the agent's own listener: a BMC without SSE delivers events by POSTing
them to a subscriber's URL. The agent subscribes with that URL and a bearer
token the BMC sends back in `HttpHeaders` (secret sources.redfish.event_token_secret);
a delivery without that token is refused (401) and never reaches a source. A
delivery only asks its source for an immediate poll: nothing in its body is
acted on by itself (the poll reads the detectors again).
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from agent.context import AgentContext
from agent.auth import caller, token_map, unauthorized

log = logging.getLogger("supernode.redfish")
MAX_EVENT_BYTES = 256 << 10
PATH = "/api/v1/redfish/events/{name}"


def mount(agent: AgentContext):
    """A route mount (agent.route_mounts) reading the running config at each request (token rotation, reload)."""

    def add(app: web.Application) -> None:
        async def push(request: web.Request) -> web.Response:
            settings = agent.loaded.config.sources.redfish
            name = settings.event_token_secret
            token = agent.loaded.secrets.get(name) if name else None
            if token is None:
                return web.json_response({"error": "push delivery is not configured "
                                                   "(sources.redfish.event_token_secret)"}, status=404)
            if caller(request, token_map(token, "redfish")) is None:
                log.warning("redfish event delivery refused: bad or missing token", extra={"remote": request.remote})
                return unauthorized()
            runner = agent.scheduler.runners.get(f"redfish/{request.match_info['name']}")
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
