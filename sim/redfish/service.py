"""One simulated Redfish service over HTTPS on 127.0.0.1: a BMC or a CDU controller, as a client meets it.

What every service here has, whatever it models (sim/redfish/tray.py,
cdu.py): the resource tree from its mockups and bindings (tree.py), session
login as DSP0266 says (POST to the Sessions collection: 201, `Location`,
`X-Auth-Token`; DELETE logs out; a session idle longer than `SessionTimeout`
expires), HTTP Basic as well, the unauthenticated service root, `/redfish`,
`$metadata` and the OData service document, an EventService with an SSE
stream and push subscriptions (events.py), Redfish error bodies, and the
faults a real BMC has: offline (connections closed, then refused), slow
(each answer delayed), refusing every credential (401), dropping its sessions.
It records the most simultaneous connections it saw, so a client's connection
bound can be checked from outside.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import secrets
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from aiohttp import web

from sim.quantities import READERS
from sim.rack import RackModel
from sim.redfish.certificates import CertificateRefused, HttpsCertificate
from sim.redfish.events import RETRY_POLICIES, EventBus, FilterError, now_iso, parse_sse_filter
from sim.redfish.leaks import LeakDetectors
from sim.redfish.pki import SimCA
from sim.redfish.tree import ROOT, Tree, build_tree, normalize

log = logging.getLogger("supernode.sim.redfish")

SESSIONS = "/redfish/v1/SessionService/Sessions"
SUBSCRIPTIONS = "/redfish/v1/EventService/Subscriptions"
SSE_URI = "/redfish/v1/EventService/SSE"
TEST_EVENT = "/redfish/v1/EventService/Actions/EventService.SubmitTestEvent"
GENERATE_CSR = "/redfish/v1/CertificateService/Actions/CertificateService.GenerateCSR"
REPLACE_CERTIFICATE = "/redfish/v1/CertificateService/Actions/CertificateService.ReplaceCertificate"
PUBLIC = {ROOT, "/redfish", "/redfish/v1/odata", "/redfish/v1/$metadata"}
BASE = "Base.1.8"
JSON_TYPE = "application/json"

ActionHandler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Credentials:
    """The one account of a simulated service; the password also lies in a file, as the agent reads secrets."""

    username: str
    password: str
    password_file: Path

    @classmethod
    def generate(cls, directory: Path, username: str = "admin") -> "Credentials":
        directory.mkdir(parents=True, exist_ok=True)
        password = secrets.token_urlsafe(18)
        path = directory / "password"
        path.write_text(password + "\n")
        path.chmod(0o600)
        return cls(username, password, path)


@dataclass
class Session:
    id: str
    token: str
    username: str
    created: str
    last_used: float

    def resource(self) -> dict[str, Any]:
        return {"@odata.type": "#Session.v1_8_0.Session", "Id": self.id, "Name": "User Session",
                "UserName": self.username, "SessionType": "Redfish", "CreatedTime": self.created,
                "@odata.id": f"{SESSIONS}/{self.id}"}


def redfish_error(status: int, key: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """A Redfish error body (DSP0266: `error` with `code`, `message` and `@Message.ExtendedInfo`)."""
    code = f"{BASE}.{key}"
    body = {"error": {"code": code, "message": message,
                      "@Message.ExtendedInfo": [{"@odata.type": "#Message.v1_2_0.Message", "MessageId": code,
                                                 "Message": message, "MessageSeverity": "Critical"}]}}
    return web.json_response(body, status=status, headers={"OData-Version": "4.0", **(headers or {})})


class RedfishService:
    """A Redfish service for one simulated device; subclasses give its mockups, bindings, terms and actions."""

    kind = "redfish"
    manager = ""  # the Manager resource of the service (set by each subclass): its log and HTTPS certificate hang there
    layers: list[tuple[str, tuple[str, ...] | None]] = []
    binding_files: tuple[str, ...] = ("services",)

    def __init__(self, name: str, model: RackModel, credentials: Credentials, ca: SimCA, *, port: int = 0,
                 session_timeout: float = 1800.0, sse_keepalive: float = 5.0, max_sessions: int = 64,
                 retry_interval: float = 1.0):
        self.name = name
        self.model = model
        self.credentials = credentials
        self.ca = ca
        self.session_timeout = session_timeout
        self.sse_keepalive = sse_keepalive
        self.max_sessions = max_sessions
        self._port = port
        self._endpoint: tuple[str, int] = ("127.0.0.1", port)
        self.cert = ca.issue(name)
        self.log_service = f"{self.manager}/LogServices/Log"  # its entries are the service's events
        self.https = HttpsCertificate(self.cert, f"{self.manager}/NetworkProtocol/HTTPS/Certificates")
        self.sessions: dict[str, Session] = {}  # token -> session
        self.events = EventBus(retry_interval=retry_interval)
        self.actions: dict[str, ActionHandler] = {TEST_EVENT: self._submit_test_event,
                                                  f"{self.log_service}/Actions/LogService.ClearLog": self._clear_log,
                                                  f"{self.manager}/Actions/Manager.Reset": self._manager_reset,
                                                  GENERATE_CSR: self._certificate_action(self.https.generate_csr),
                                                  REPLACE_CERTIFICATE: self._certificate_action(self.https.replace)}
        self.terms: dict[str, Callable[[str], Any]] = {
            "username": lambda a: self.credentials.username,
            "session_timeout": lambda a: int(self.session_timeout),
            "retry_interval": lambda a: int(round(self.events.retry_interval)),
            "retry_attempts": lambda a: self.events.retry_attempts,
            "date_time": lambda a: now_iso().replace("Z", "+00:00"),
            "https_port": lambda a: self._endpoint[1],
            "certificate_links": lambda a: [{"@odata.id": self.https.uri}],
            "manager_links": lambda a: [{"@odata.id": self.manager}],
            "firmware_version": lambda a: self.tree.resources[self.manager]["FirmwareVersion"],
            "detector_state": lambda a: self._leaks().state(a),
            "detector_excerpt_state": lambda a: self._leaks().excerpt_state(a),
            "detector_status": lambda a: self._leaks().status(a),
            "leak_health": lambda a: self._leaks().health(),
        }
        self.add_terms()
        self.tree: Tree = build_tree(self.layers, self.binding_files, self.resolve)
        with model.lock:
            self.leaks: LeakDetectors | None = self.leak_detectors()
        # faults
        self.offline = False
        self.slow_s = 0.0
        self.auth_fail = False
        self._events_open: asyncio.Event | None = None  # set: events flow; clear: held back (set_events_held)
        # what tests look at
        self.peak_connections = 0
        self.requests_total = 0
        self.reads: Counter[str] = Counter()  # GETs by path: how often each resource (a leak detector) was read
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._listening = asyncio.Lock()

    # -- what subclasses add -------------------------------------------------------

    def add_terms(self) -> None:
        """Register this service's model terms in `self.terms` (name -> reader taking the term's argument)."""

    def leak_detectors(self) -> LeakDetectors | None:
        """The service's leak detectors (their Ids and URIs from the tree, their states from the model), if any."""
        return None

    def _leaks(self) -> LeakDetectors:
        if self.leaks is None:
            raise KeyError(f"{self.name} has no leak detectors")
        return self.leaks

    def update(self, model: RackModel) -> None:
        """Called after each model tick under `model.lock`: raise events for state changes (cheap, no I/O)."""
        if self.leaks is not None:
            self.leaks.update()

    # -- terms ---------------------------------------------------------------------

    def resolve(self, term: str) -> Callable[[], Any]:
        """A reader for a binding term: `QUANTITY[.ARG] [* FACTOR]` of sim/quantities.py, or a service term."""
        expr, _, factor = term.partition("*")
        expr = expr.strip()
        scale = float(factor) if factor.strip() else None
        name, arg = expr, ""
        if name not in READERS and name not in self.terms:
            head, _, tail = expr.rpartition(".")
            if head in READERS or head in self.terms:
                name, arg = head, tail
        model = self.model
        if name in READERS:
            reader = READERS[name]
            return lambda: round(reader(model, arg, None) * (scale if scale is not None else 1.0), 2)
        if name in self.terms:
            fn = self.terms[name]
            if scale is not None:
                return lambda: round(fn(arg) * scale, 2)
            return lambda: fn(arg)
        raise KeyError(f"not a model quantity nor a {self.kind} term")

    # -- lifecycle -----------------------------------------------------------------

    @property
    def endpoint(self) -> tuple[str, int]:
        return self._endpoint

    @property
    def url(self) -> str:
        return f"https://{self._endpoint[0]}:{self._endpoint[1]}"

    def describe(self) -> dict[str, Any]:
        """What a client config needs (and what a test looks at): URL, CA and certificate, credentials, counters."""
        return {"kind": self.kind, "endpoint": f"{self._endpoint[0]}:{self._endpoint[1]}", "url": self.url,
                "service_root": self.url + ROOT, "ca_file": str(self.ca.ca_file), "cert_file": str(self.cert.cert_file),
                "certificate_uri": self.https.uri,
                "username": self.credentials.username, "password_file": str(self.credentials.password_file),
                "sse_uri": SSE_URI, "sessions": len(self.sessions), "subscriptions": len(self.events.subscriptions),
                "sse_streams": len(self.events.streams), "peak_connections": self.peak_connections,
                "requests_total": self.requests_total,
                "faults": {"offline": self.offline, "slow_ms": self.slow_s * 1000, "auth_fail": self.auth_fail}}

    def clients(self, within: float) -> int:
        """Login sessions that made a request, or held an event stream open, in the last `within` seconds:
        the clients reading this service (tests of rack coordination count them, as the Modbus devices do)."""
        now = time.monotonic()
        return sum(1 for s in list(self.sessions.values()) if now - s.last_used <= within)

    async def start(self) -> None:
        await self.events.start()
        app = web.Application(client_max_size=64 * 1024, middlewares=[self._middleware])
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        await self._listen()

    async def _listen(self) -> None:
        async with self._listening:
            if self._site is not None or self._runner is None:
                return
            site = web.TCPSite(self._runner, "127.0.0.1", self._endpoint[1], ssl_context=self.https.context,
                               reuse_address=True)
            await site.start()
            self._site = site
            sock = site._server.sockets[0]  # type: ignore[union-attr]
            self._endpoint = ("127.0.0.1", sock.getsockname()[1])

    async def _unlisten(self) -> None:
        async with self._listening:
            if self._site is not None:
                await self._site.stop()
                self._site = None

    async def stop(self) -> None:
        await self.events.stop()
        if self._runner is not None:
            for conn in self._runner.server.connections if self._runner.server else ():
                conn.force_close()
            await self._runner.cleanup()
            self._runner = None
            self._site = None

    # -- faults ----------------------------------------------------------------------

    def set_offline(self, offline: bool) -> None:
        """Offline: every connection closed at once, then the port refuses; back online listens on the same port."""
        self.offline = offline
        loop = asyncio.get_running_loop()
        if offline:
            self.events.close_streams()
            if self._runner is not None and self._runner.server is not None:
                for conn in self._runner.server.connections:
                    conn.force_close()
            loop.create_task(self._unlisten())
        else:
            loop.create_task(self._listen())

    def set_slow(self, ms: float) -> None:
        self.slow_s = max(ms, 0.0) / 1000.0

    def set_auth_fail(self, fail: bool) -> None:
        self.auth_fail = fail

    def set_events_held(self, held: bool) -> None:
        """Held: the EventService is not ready yet, as on a BMC still starting it: an SSE request waits without
        an answer (no headers) and a push subscription is refused with 503, until released."""
        if self._events_open is None:
            self._events_open = asyncio.Event()
            self._events_open.set()
        (self._events_open.clear if held else self._events_open.set)()

    @property
    def events_held(self) -> bool:
        return self._events_open is not None and not self._events_open.is_set()

    def expire_sessions(self) -> int:
        """Drop every session now (as a BMC reboot or a timeout does); their SSE streams end with them."""
        dropped = list(self.sessions.values())
        self.sessions.clear()
        for s in dropped:
            self.events.close_session_streams(s.id)
        return len(dropped)

    async def _manager_reset(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        """Manager.Reset: the management controller restarts, so every session and SSE stream ends."""
        if body.get("ResetType", "GracefulRestart") not in ("ForceRestart", "GracefulRestart"):
            return redfish_error(400, "ActionParameterValueNotInList", f"The value '{body.get('ResetType')}' for the "
                                 "parameter ResetType in the action Manager.Reset is not in the list of acceptable "
                                 "values (ForceRestart, GracefulRestart).")
        self.expire_sessions()
        self.events.close_streams()
        return web.Response(status=204, headers={"OData-Version": "4.0"})

    def clear_faults(self) -> None:
        self.set_slow(0)
        self.auth_fail = False
        if self.events_held:
            self.set_events_held(False)
        if self.offline:
            self.set_offline(False)

    # -- HTTP --------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if self.offline:  # the device is gone: no answer, the connection just closes
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=503)
        self.requests_total += 1
        if request.method == "GET":
            self.reads[request.path.rstrip("/")] += 1
        if self._runner is not None and self._runner.server is not None:
            self.peak_connections = max(self.peak_connections, len(self._runner.server.connections))
        if self.slow_s:
            await asyncio.sleep(self.slow_s)
        return await handler(request)

    def _authenticate(self, request: web.Request) -> Session | str | None:
        """The caller's session, or its user name for Basic auth, or None (401)."""
        if self.auth_fail:
            return None
        now = time.monotonic()
        for token, s in list(self.sessions.items()):
            if now - s.last_used > self.session_timeout:
                del self.sessions[token]
                self.events.close_session_streams(s.id)
        token = request.headers.get("X-Auth-Token")
        if token:
            session = self.sessions.get(token)
            if session is not None:
                session.last_used = now
            return session
        auth = request.headers.get("Authorization", "")
        if auth[:6].lower() == "basic ":
            try:
                user, _, password = base64.b64decode(auth[6:].strip(), validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            if self._check(user, password):
                return user
        return None

    def _check(self, user: str, password: str) -> bool:
        ok_user = hmac.compare_digest(user.encode(), self.credentials.username.encode())
        ok_password = hmac.compare_digest(password.encode(), self.credentials.password.encode())
        return ok_user and ok_password and not self.auth_fail

    @staticmethod
    def _unauthorized() -> web.Response:
        return redfish_error(401, "NoValidSession", "There is no valid session established with the implementation.",
                             {"WWW-Authenticate": 'Basic realm="Redfish"'})

    def _allow(self, path: str) -> str:
        if path in (SESSIONS, SUBSCRIPTIONS):
            return "GET, HEAD, POST"
        if path.startswith(SESSIONS + "/"):
            return "GET, HEAD, DELETE"
        if path.startswith(SUBSCRIPTIONS + "/"):
            return "GET, HEAD, PATCH, DELETE"
        if path in self.actions:
            return "POST"
        if path in self.tree.writable:
            return "GET, HEAD, PATCH"
        return "GET, HEAD"

    def _json(self, body: Any, path: str, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(text=json.dumps(body), status=status, content_type=JSON_TYPE, charset="utf-8",
                            headers={"OData-Version": "4.0", "Cache-Control": "no-cache", "Allow": self._allow(path),
                                     **(headers or {})})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = normalize(request.path)
        method = request.method
        public = path in PUBLIC or (path == SESSIONS and method == "POST")
        principal = None if public else self._authenticate(request)
        if not public and principal is None:
            return self._unauthorized()
        if method in ("GET", "HEAD"):
            if path == SSE_URI:
                return await self._sse(request, principal)
            if path == "/redfish/v1/$metadata":
                return web.Response(text=self._metadata(), content_type="application/xml", charset="utf-8",
                                    headers={"OData-Version": "4.0"})
            body = self._get(path)
            if body is None:
                return redfish_error(404, "ResourceNotFound", f"The requested resource {path} was not found.")
            return self._json(body, path)
        known = self._get(path) is not None or path in self.actions
        if method == "POST":
            if path == SESSIONS:
                return await self._login(request)
            if path == SUBSCRIPTIONS:
                return await self._subscribe(request)
            if path in self.actions:
                body = await self._body(request)
                if isinstance(body, web.Response):
                    return body
                return await self.actions[path](request, body)
        elif method == "PATCH" and path.startswith(SUBSCRIPTIONS + "/") and \
                path.rsplit("/", 1)[1] in self.events.subscriptions:
            return await self._patch_subscription(request, path.rsplit("/", 1)[1])
        elif method == "PATCH" and path in self.tree.writable:
            body = await self._body(request)
            if isinstance(body, web.Response):
                return body
            with self.model.lock:
                refused = self.tree.patch(path, body)
            if refused:
                return redfish_error(400, *refused)
            return self._json(self._get(path), path)
        elif method == "DELETE":
            if path.startswith(SESSIONS + "/"):
                return self._logout(path.rsplit("/", 1)[1])
            if path.startswith(SUBSCRIPTIONS + "/") and self.events.remove(path.rsplit("/", 1)[1]):
                return web.Response(status=204, headers={"OData-Version": "4.0"})
        if not known:
            return redfish_error(404, "ResourceNotFound", f"The requested resource {path} was not found.")
        return redfish_error(405, "OperationNotAllowed", f"{method} is not allowed on {path}.",
                             {"Allow": self._allow(path)})

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        raw = await request.read()
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return redfish_error(400, "MalformedJSON", "The request body submitted was malformed JSON.")
        if not isinstance(body, dict):
            return redfish_error(400, "MalformedJSON", "The request body must be a JSON object.")
        return body

    def _get(self, path: str) -> Any:
        if path == "/redfish":
            return {"v1": ROOT}
        if path == "/redfish/v1/odata":
            return self._odata()
        if path == SESSIONS:
            return self._collection(SESSIONS, "#SessionCollection.SessionCollection", "Session Collection",
                                    [f"{SESSIONS}/{s.id}" for s in self.sessions.values()])
        if path.startswith(SESSIONS + "/"):
            sid = path.rsplit("/", 1)[1]
            return next((s.resource() for s in self.sessions.values() if s.id == sid), None)
        entries = f"{self.log_service}/Entries"
        if path == entries:  # a log's entries are expanded in its collection (DMTF's schema auto-expands them)
            members = [self.events.log_entry(e, f"{entries}/{e.id}") for e in self.events.log]
            return {"@odata.type": "#LogEntryCollection.LogEntryCollection", "Name": "Log Entry Collection",
                    "Members@odata.count": len(members), "Members": members, "@odata.id": entries}
        if path.startswith(entries + "/"):
            eid = path.rsplit("/", 1)[1]
            return next((self.events.log_entry(e, path) for e in self.events.log if str(e.id) == eid), None)
        if path == SUBSCRIPTIONS:
            return self._collection(SUBSCRIPTIONS, "#EventDestinationCollection.EventDestinationCollection",
                                    "Event Subscriptions Collection",
                                    [f"{SUBSCRIPTIONS}/{i}" for i in self.events.subscriptions])
        if path.startswith(SUBSCRIPTIONS + "/"):
            sub = self.events.subscriptions.get(path.rsplit("/", 1)[1])
            return sub.resource(path) if sub else None
        if path == self.https.uri:
            return self.https.resource()
        with self.model.lock:
            return self.tree.render(path)

    @staticmethod
    def _collection(uri: str, odata_type: str, name: str, members: list[str]) -> dict[str, Any]:
        return {"@odata.type": odata_type, "Name": name, "Members@odata.count": len(members),
                "Members": [{"@odata.id": m} for m in members], "@odata.id": uri}

    def _odata(self) -> dict[str, Any]:
        root = self.tree.resources[ROOT]
        value = [{"name": "Service", "kind": "Singleton", "url": ROOT}]
        value += [{"name": k, "kind": "Singleton", "url": v["@odata.id"]} for k, v in root.items()
                  if isinstance(v, dict) and set(v) == {"@odata.id"}]
        return {"@odata.context": "/redfish/v1/$metadata", "value": value}

    def _metadata(self) -> str:
        """CSDL references for every type the service serves, as a client with no schema cache reads them."""
        types = {body["@odata.type"] for body in self.tree.resources.values() if "@odata.type" in body}
        types |= {"#SessionCollection.SessionCollection", "#Session.v1_8_0.Session", "#Event.v1_11_0.Event",
                  "#EventDestinationCollection.EventDestinationCollection",
                  "#EventDestination.v1_16_0.EventDestination"}
        spaces: dict[str, set[str]] = {}
        for t in types:
            ns = t.lstrip("#").rsplit(".", 1)[0]
            spaces.setdefault(ns.split(".")[0], set()).add(ns)
        refs = "".join(
            f'  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/{base}_v1.xml">\n'
            + "".join(f'    <edmx:Include Namespace="{n}"/>\n' for n in sorted(names | {base}))
            + "  </edmx:Reference>\n" for base, names in sorted(spaces.items()))
        root_type = self.tree.resources[ROOT]["@odata.type"].lstrip("#").rsplit(".", 1)[0]
        return ('<?xml version="1.0" encoding="UTF-8"?>\n'
                '<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">\n' + refs +
                '  <edmx:DataServices>\n    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="Service">\n'
                f'      <EntityContainer Name="Service" Extends="{root_type}.ServiceContainer"/>\n'
                '    </Schema>\n  </edmx:DataServices>\n</edmx:Edmx>\n')

    # -- sessions ----------------------------------------------------------------------

    async def _login(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        user, password = body.get("UserName"), body.get("Password")
        if not isinstance(user, str) or not isinstance(password, str):
            return redfish_error(400, "PropertyMissing", "The request body must carry the UserName and Password strings.")
        if not self._check(user, password):
            return redfish_error(401, "ResourceAtUriUnauthorized", "While accessing the resource at "
                                 f"{SESSIONS}, the service received an authorization error: bad credentials.")
        if len(self.sessions) >= self.max_sessions:
            return redfish_error(503, "SessionLimitExceeded", "The session establishment failed due to the number "
                                 "of simultaneous sessions exceeding the limit of the implementation.")
        session = Session(secrets.token_hex(8), secrets.token_urlsafe(24), user, now_iso(), time.monotonic())
        self.sessions[session.token] = session
        location = f"{SESSIONS}/{session.id}"
        return self._json(session.resource(), location, 201, {"Location": location, "X-Auth-Token": session.token})

    def _logout(self, sid: str) -> web.Response:
        for token, s in list(self.sessions.items()):
            if s.id == sid:
                del self.sessions[token]
                self.events.close_session_streams(s.id)
                return web.Response(status=204, headers={"OData-Version": "4.0"})
        return redfish_error(404, "ResourceNotFound", f"The requested resource {SESSIONS}/{sid} was not found.")

    # -- events ------------------------------------------------------------------------

    async def _subscribe(self, request: web.Request) -> web.Response:
        if self.events_held:
            return redfish_error(503, "ServiceTemporarilyUnavailable", "The EventService is not available yet.")
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        dest = body.get("Destination")
        if not isinstance(dest, str):
            return redfish_error(400, "PropertyMissing", "The property Destination is a required property.")
        if body.get("Protocol", "Redfish") != "Redfish":
            return redfish_error(400, "PropertyValueNotInList", "Protocol: only Redfish is supported.")
        headers = self._headers(body.get("HttpHeaders"))
        if headers is None:
            return redfish_error(400, "PropertyValueTypeError", "HttpHeaders: expected objects of header name to "
                                 "string value.")
        lists = {}
        for prop in ("EventTypes", "RegistryPrefixes", "MessageIds"):
            value = body.get(prop) or []
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                return redfish_error(400, "PropertyValueTypeError", f"{prop}: expected an array of strings.")
            lists[prop] = value
        origins = [o.get("@odata.id") if isinstance(o, dict) else o for o in body.get("OriginResources") or []]
        if not all(isinstance(o, str) for o in origins):
            return redfish_error(400, "PropertyValueTypeError", "OriginResources: expected links (@odata.id).")
        try:
            sub = self.events.subscribe(dest, str(body.get("Context", "")), headers, lists["EventTypes"],
                                        lists["RegistryPrefixes"], lists["MessageIds"], origins,
                                        bool(body.get("VerifyCertificate", False)),
                                        str(body.get("DeliveryRetryPolicy", "TerminateAfterRetries")))
        except ValueError as exc:
            return redfish_error(400, "PropertyValueFormatError", str(exc))
        location = f"{SUBSCRIPTIONS}/{sub.id}"
        return self._json(sub.resource(location), location, 201, {"Location": location})

    @staticmethod
    def _headers(items: Any) -> dict[str, str] | None:
        """EventDestination.HttpHeaders (objects of header name to value) as one dict; None if malformed."""
        headers: dict[str, str] = {}
        for item in items or ():
            if not isinstance(item, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in item.items()):
                return None
            headers.update(item)
        return headers

    async def _patch_subscription(self, request: web.Request, sub_id: str) -> web.Response:
        """PATCH of a subscription: Context, HttpHeaders (a new token) and DeliveryRetryPolicy, all or none."""
        sub = self.events.subscriptions[sub_id]
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        extra = sorted(set(body) - {"Context", "HttpHeaders", "DeliveryRetryPolicy"})
        if extra:
            return redfish_error(400, "PropertyNotWritable", f"The property {extra[0]} is a read only property and "
                                 "cannot be assigned a value.")
        headers = self._headers(body.get("HttpHeaders")) if "HttpHeaders" in body else sub.headers
        if headers is None:
            return redfish_error(400, "PropertyValueTypeError", "HttpHeaders: expected objects of header name to "
                                 "string value.")
        policy = body.get("DeliveryRetryPolicy", sub.retry_policy)
        if policy not in RETRY_POLICIES:
            return redfish_error(400, "PropertyValueNotInList", f"DeliveryRetryPolicy: one of {', '.join(RETRY_POLICIES)}")
        sub.headers, sub.retry_policy = headers, policy
        sub.context = str(body.get("Context", sub.context))
        path = f"{SUBSCRIPTIONS}/{sub_id}"
        return self._json(sub.resource(path), path)

    async def _sse(self, request: web.Request, principal: Session | str | None) -> web.StreamResponse:
        try:
            match = parse_sse_filter(request.query.get("$filter"))
        except FilterError as exc:
            return redfish_error(400, "QueryParameterValueFormatError", str(exc))
        try:
            last_id = int(request.headers.get("Last-Event-ID", "0") or 0)
        except ValueError:
            last_id = 0
        if self._events_open is not None:
            await self._events_open.wait()  # held back: the client waits for the stream's headers
        session = principal if isinstance(principal, Session) else None
        client = self.events.open_stream(match, session.id if session else None)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "OData-Version": "4.0"})
        try:
            await resp.prepare(request)
            for event in self.events.since(last_id):
                if match(event):
                    await resp.write(self._sse_frame(event))
            while True:
                try:
                    async with asyncio.timeout(self.sse_keepalive):
                        event = await client.queue.get()
                except asyncio.TimeoutError:
                    await resp.write(b": keep-alive\n\n")
                    if session is not None:
                        session.last_used = time.monotonic()
                    continue
                if event is None:
                    break
                await resp.write(event if isinstance(event, bytes) else self._sse_frame(event))  # bytes: a fault
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.events.close_stream(client)
        if request.transport is not None:
            request.transport.close()
        return resp

    def _certificate_action(self, act: Callable[[dict[str, Any]], Any]) -> ActionHandler:
        async def handler(request: web.Request, body: dict[str, Any]) -> web.Response:
            try:
                result = act(body)
            except CertificateRefused as exc:
                return redfish_error(400, exc.key, str(exc))
            if result is None:
                return web.Response(status=204, headers={"OData-Version": "4.0"})
            return self._json(result, GENERATE_CSR)
        return handler

    async def _clear_log(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        self.events.log.clear()
        return web.Response(status=204, headers={"OData-Version": "4.0"})

    @staticmethod
    def _sse_frame(event: Any) -> bytes:
        return f"id: {event.id}\ndata: {json.dumps(event.payload())}\n\n".encode()

    async def _submit_test_event(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        """EventService.SubmitTestEvent: the record as the client gave it (MessageId required), sent to everyone."""
        message_id = body.get("MessageId")
        if not isinstance(message_id, str):
            return redfish_error(400, "ActionParameterMissing", "The action SubmitTestEvent requires the parameter "
                                 "MessageId to be present in the request body.")
        if body.get("Severity", "OK") not in ("OK", "Warning", "Critical"):
            return redfish_error(400, "ActionParameterValueNotInList", f"The value '{body.get('Severity')}' for the "
                                 "parameter Severity in the action SubmitTestEvent is not in the list of acceptable "
                                 "values (OK, Warning, Critical).")
        record = {"EventType": str(body.get("EventType", "Alert")), "EventTimestamp": now_iso(), "MemberId": "0",
                  "MessageId": message_id, "Message": str(body.get("Message", "Test event.")),
                  "MessageArgs": [str(a) for a in body.get("MessageArgs") or []],
                  "MessageSeverity": str(body.get("Severity", "OK")), "Severity": str(body.get("Severity", "OK"))}
        origin = body.get("OriginOfCondition")
        if isinstance(origin, str):
            record["OriginOfCondition"] = {"@odata.id": origin}
        self.events.publish_record(record)
        return web.Response(status=204, headers={"OData-Version": "4.0"})
