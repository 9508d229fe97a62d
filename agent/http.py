"""The agent's HTTP surface: /metrics, health, state API, reload, the status page; remediation mounts its routes here.

Bound to the configured address only. Anything that changes state needs an
admin token (agent.auth); /metrics, /healthz, /readyz and /api/v1/state are
open because they carry no secret (state holds the config with secret *file
paths* only, and readings /metrics already shows) and Prometheus must scrape
without credentials. The listener defends itself (agent.listener): connection
cap, header/body deadlines, rate-limited logs; an optional Host allow-list
stops DNS rebinding; `Server` names no version; every answer carries a Content
Security Policy allowing nothing but this origin (agent.listener).
"""

from __future__ import annotations

import json
import logging
import ssl
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

import aiohttp.web_response
from agent.context import AgentContext
from agent.auth import requires_admin
from agent.compression import encode
from agent.config import Listen
from agent.listener import ACCEPT_BACKLOG, ConnectionGuard, add_security_headers, install_log_limits
from agent.status.http import add_status_routes

log = logging.getLogger("supernode.http")


def ssl_context(listen: Listen) -> ssl.SSLContext | None:
    if listen.tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(listen.tls.cert_file), str(listen.tls.key_file))
    if listen.tls.client_ca_file is not None:
        ctx.load_verify_locations(str(listen.tls.client_ca_file))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


SERVER_NAME = "supernode-agent"
GUARD = web.AppKey("connection_guard", ConnectionGuard)

# Every response aiohttp writes, its own 400s included, takes its `Server` header from this module
# global: naming no version tells a scanner nothing.
aiohttp.web_response.SERVER_SOFTWARE = SERVER_NAME  # type: ignore[attr-defined]


def host_allowed(host: str, allowed: list[str]) -> bool:
    """`Host` without its port, compared case-insensitively ([v6]:port and name:port alike)."""
    if host.startswith("["):
        name = host[1:].partition("]")[0]
    else:
        name = host.rpartition(":")[0] if host.count(":") == 1 else host
    return name.lower() in allowed


def host_filter(allowed: list[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    allowed = [h.lower() for h in allowed]

    @web.middleware
    async def check_host(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                         ) -> web.StreamResponse:
        if not host_allowed(request.headers.get("Host", ""), allowed):
            log.warning("request refused: Host not in listen.allowed_hosts")
            return web.json_response({"error": "Host not allowed (listen.allowed_hosts)"}, status=421)
        return await handler(request)
    return check_host


def build_app(agent: AgentContext) -> web.Application:
    listen = agent.loaded.config.listen
    guard = ConnectionGuard(listen.max_connections, listen.header_timeout_seconds, listen.body_timeout_seconds)
    middlewares = [host_filter(listen.allowed_hosts)] if listen.allowed_hosts else []
    app = web.Application(client_max_size=listen.max_body_bytes, middlewares=middlewares + [guard.middleware()])
    app[GUARD] = guard
    agent.registry.register(guard.collector())
    app.on_shutdown.append(guard.stop)
    app.on_response_prepare.append(add_security_headers)

    async def metrics(request: web.Request) -> web.Response:
        body, headers = encode(agent.render_metrics(), request.headers.get("Accept-Encoding", ""))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST, **headers})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        # Degraded remediation is said, not failed: observation (what readiness gates) still works.
        degraded = agent.remediation_degraded()
        remediation = {"ok": degraded is None, **({"degraded": degraded} if degraded else {})}
        pending = agent.sources_not_polled()
        if pending:
            return web.json_response({"ready": False, "waiting_for": pending, "remediation": remediation},
                                     status=503)
        return web.json_response({"ready": True, "remediation": remediation})

    async def state(_: web.Request) -> web.Response:
        return web.json_response(agent.state_dict(), dumps=lambda o: json.dumps(o, default=str))

    @requires_admin(lambda: agent.loaded.admin_tokens)
    async def reload(request: web.Request, who: str) -> web.Response:
        log.info("reload requested", extra={"who": who})
        ok, message = await agent.reload()
        return web.json_response({"reloaded": ok, "message": message}, status=200 if ok else 400)

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/v1/state", state)
    app.router.add_post("/-/reload", reload)
    for mount in agent.route_mounts:
        mount(app)
    agent.status_hub = add_status_routes(app, agent)  # answers 404 while status.enabled is off (reloadable)
    return app


RouteMount = Callable[[web.Application], None]


async def start_server(app: web.Application, listen: Listen) -> tuple[web.AppRunner, int]:
    install_log_limits()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    guard = app[GUARD]
    assert runner.server is not None
    guard.attach(runner.server)
    guard.start()
    site = web.TCPSite(runner, host=listen.address, port=listen.port, ssl_context=ssl_context(listen),
                       reuse_address=True, backlog=ACCEPT_BACKLOG)
    await site.start()
    server = site._server
    port = server.sockets[0].getsockname()[1] if server and server.sockets else listen.port
    return runner, port


__all__ = ["build_app", "start_server", "RouteMount", "Awaitable"]
