"""The agent's HTTP surface: /metrics, health, state API, reload; remediation mounts its routes here.

Bound to the configured address only. Anything that changes state needs the
admin token (bearer, compared in constant time); reads are open because they
carry no secrets and Prometheus must scrape without credentials.
"""

from __future__ import annotations

import json
import logging
import ssl
from typing import TYPE_CHECKING, Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from agent.auth import requires_admin
from agent.config import Listen

if TYPE_CHECKING:
    from agent.daemon import Agent

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


def build_app(agent: "Agent") -> web.Application:
    app = web.Application(client_max_size=agent.loaded.config.listen.max_body_bytes)

    async def metrics(_: web.Request) -> web.Response:
        body = agent.render_metrics()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

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
    return app


RouteMount = Callable[[web.Application], None]


async def start_server(app: web.Application, listen: Listen) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host=listen.address, port=listen.port, ssl_context=ssl_context(listen),
                       reuse_address=True)
    await site.start()
    server = site._server
    port = server.sockets[0].getsockname()[1] if server and server.sockets else listen.port
    return runner, port


__all__ = ["build_app", "start_server", "RouteMount", "Awaitable"]
