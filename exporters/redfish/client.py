"""A small Redfish HTTP client: verified TLS, session auth with re-login, bounded connections, clear errors.

Why our own over a library: the DMTF python-redfish-library is synchronous and
retries on its own schedule; the agent needs asyncio (one event loop runs every
source), its own timeouts and backoff, and every failure as a `SourceError`
whose kind names what went wrong (tls, auth, timeout, connection, protocol).

Security: the BMC's certificate is always verified, against a CA file (or the
system store), or pinned by its SHA-256 fingerprint (BMCs are often
self-signed); there is no way to turn verification off. Only paths under
`/redfish/v1` of the configured origin are ever requested: a link elsewhere in
a reply is refused, never followed.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Literal
from urllib.parse import urlsplit

import aiohttp

from exporters.model import SourceError

AuthMode = Literal["session", "basic"]
MAX_BODY_BYTES = 4 << 20  # one resource; a BMC's largest (a collection with excerpts) is far below
MAX_EVENT_BYTES = 1 << 20
SERVICE_ROOT = "/redfish/v1/"
LOGIN_BACKOFF_MAX_S = 300.0


class NotFound(SourceError):
    """A 404: a cached resource moved (the tree is walked again) or a chain does not exist on this service."""

    def __init__(self, uri: str):
        super().__init__("protocol", f"{uri}: 404 not found")
        self.uri = uri


class EventStreamError(SourceError):
    """The event stream ended or could not be read; `reason` (a short fixed word) is what the stream failures
    counter is labelled with: too_long, not_utf8, not_json, connection, timeout, auth, protocol, unexpected."""

    def __init__(self, reason: str, message: str):
        kind = reason if reason in ("connection", "timeout", "auth", "protocol", "tls") else "decode"
        super().__init__(kind, message)
        self.reason = reason


async def _sse_data(stream: aiohttp.StreamReader, uri: str) -> AsyncIterator[str]:
    """The data of each event of an SSE byte stream (its `data:` lines joined), lines split from raw chunks so
    none is buffered past MAX_EVENT_BYTES; `EventStreamError` too_long or not_utf8."""
    buf = bytearray()
    data: list[str] = []
    size = 0
    async for chunk in stream.iter_any():
        buf += chunk
        while (nl := buf.find(b"\n")) >= 0:
            raw = bytes(buf[:nl]).rstrip(b"\r")
            del buf[:nl + 1]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise EventStreamError("not_utf8", f"event stream {uri}: a line is not UTF-8") from None
            if not line:
                if data:
                    yield "\n".join(data)
                data, size = [], 0
            elif line.startswith("data:"):
                size += len(raw)
                if size > MAX_EVENT_BYTES:
                    raise EventStreamError("too_long", f"event stream {uri}: one event over {MAX_EVENT_BYTES} bytes")
                data.append(line[5:].removeprefix(" "))
        if len(buf) > MAX_EVENT_BYTES:
            raise EventStreamError("too_long", f"event stream {uri}: a line over {MAX_EVENT_BYTES} bytes")


@dataclass
class ClientStats:
    requests: int = 0
    logins: int = 0
    auth_fallbacks: list[str] = field(default_factory=list)


def parse_pin(text: str) -> bytes:
    """A SHA-256 fingerprint as 64 hex digits, colons allowed (`openssl x509 -fingerprint -sha256`)."""
    digits = text.replace(":", "").strip().lower()
    if len(digits) != 64 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError("expected a SHA-256 fingerprint: 64 hex digits (colons allowed)")
    return bytes.fromhex(digits)


def tls_for(ca_file: Path | str | None, pinned_sha256: str | None) -> ssl.SSLContext | aiohttp.Fingerprint:
    """Verified TLS: the certificate pinned by fingerprint, or a chain to `ca_file` (or the system CAs) and the
    host name. There is no unverified option."""
    if pinned_sha256:
        return aiohttp.Fingerprint(parse_pin(pinned_sha256))
    try:
        return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise SourceError("config", f"ca_file {ca_file}: {getattr(exc, 'strerror', None) or exc}") from None


def origin_of(url: str) -> str:
    """`https://host:port` of a service URL; only https (credentials travel with every request)."""
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname:
        raise ValueError(f"expected an https:// URL with a host, got {url!r}")
    if parts.path not in ("", "/", "/redfish", "/redfish/", "/redfish/v1", "/redfish/v1/") or parts.query:
        raise ValueError(f"expected the service's origin (https://host[:port]), got {url!r}")
    return f"https://{parts.netloc}"


class RedfishClient:
    """One Redfish service: its connection pool (at most `max_connections`), its session, its errors."""

    def __init__(self, url: str, *, user: str | None = None, password: str | None = None,
                 ca_file: Path | str | None = None, pinned_sha256: str | None = None, auth: AuthMode = "session",
                 request_timeout: float = 1.0, max_connections: int = 2, login_retry_s: float = 5.0):
        self.origin = origin_of(url)
        self.user, self._password = user, password
        self.auth: AuthMode = auth
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.tls = tls_for(ca_file, pinned_sha256)
        self.pinned = bool(pinned_sha256)
        self.login_retry_s = login_retry_s
        self.sessions_uri: str | None = None  # learnt from the service root by discovery
        self.stats = ClientStats()
        self._token: str | None = None
        self._session_uri: str | None = None
        self._generation = 0  # bumped at each login, so concurrent 401s log in once
        self._login_lock = asyncio.Lock()
        self._login_blocked_until = 0.0
        self._login_delay = login_retry_s
        self._http: aiohttp.ClientSession | None = None

    # -- plumbing -------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            conn = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections,
                                        ssl=self.tls, enable_cleanup_closed=True)
            self._http = aiohttp.ClientSession(connector=conn, auto_decompress=True,
                                               headers={"Accept": "application/json", "OData-Version": "4.0"})
        return self._http

    def url(self, uri: str) -> str:
        """The absolute URL of a service path; anything outside /redfish/v1 of our origin is refused."""
        parts = urlsplit(uri)
        if parts.scheme or parts.netloc:
            if f"{parts.scheme}://{parts.netloc}" != self.origin:
                raise SourceError("protocol", f"link {uri!r} leaves the service {self.origin}: not followed")
            uri = parts.path + (f"?{parts.query}" if parts.query else "")
        if not (uri == "/redfish/v1" or uri.startswith("/redfish/v1/")) or ".." in uri.split("/"):
            raise SourceError("protocol", f"link {uri!r} is not a /redfish/v1 path: not followed")
        return self.origin + uri

    def _auth_headers(self) -> dict[str, str]:
        if self._token:
            return {"X-Auth-Token": self._token}
        if self.auth == "basic" and self.user:
            return {"Authorization": aiohttp.BasicAuth(self.user, self._password or "").encode()}
        return {}

    async def _send(self, method: str, uri: str, body: Any = None, timeout: float | None = None,
                    stream: bool = False) -> aiohttp.ClientResponse:
        url = self.url(uri)
        t = self.request_timeout if timeout is None else timeout
        self.stats.requests += 1
        kwargs: dict[str, Any] = {"headers": self._auth_headers(), "allow_redirects": False}
        if body is not None:
            kwargs["json"] = body
        kwargs["timeout"] = aiohttp.ClientTimeout(total=None if stream else t, sock_connect=t,
                                                  sock_read=None if stream else t)
        try:
            return await self._session().request(method, url, **kwargs)
        except asyncio.TimeoutError:
            raise SourceError("timeout", f"{method} {uri}: no answer within {t:g}s") from None
        except aiohttp.ServerFingerprintMismatch:
            raise SourceError("tls", f"{self.origin}: the certificate does not match the pinned SHA-256 "
                                     f"fingerprint") from None
        except aiohttp.ClientConnectorCertificateError as exc:
            raise SourceError("tls", f"{self.origin}: certificate not trusted: {exc.certificate_error}") from None
        except aiohttp.ClientSSLError as exc:
            raise SourceError("tls", f"{self.origin}: TLS handshake failed: {exc}") from None
        except aiohttp.ClientConnectorError as exc:
            raise SourceError("connection", f"{self.origin}: {exc.strerror or exc}") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise SourceError("connection", f"{method} {uri}: {type(exc).__name__}: {exc}") from None

    async def _read_json(self, resp: aiohttp.ClientResponse, uri: str, limit: int = MAX_BODY_BYTES) -> Any:
        try:
            raw = await resp.content.read(limit + 1)
        except asyncio.TimeoutError:
            raise SourceError("timeout", f"GET {uri}: body not received within {self.request_timeout:g}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise SourceError("connection", f"GET {uri}: {type(exc).__name__}: {exc}") from None
        finally:
            resp.release()
        if len(raw) > limit:
            raise SourceError("decode", f"GET {uri}: reply over {limit} bytes")
        if not raw:
            return None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise SourceError("decode", f"GET {uri}: reply is not JSON") from None

    # -- requests -----------------------------------------------------------------------

    async def request(self, method: str, uri: str, body: Any = None, authenticated: bool = True,
                      timeout: float | None = None) -> tuple[int, Any, dict[str, str]]:
        """(status, JSON body or None, headers); a 401 logs in again once (session auth) and retries."""
        for attempt in (0, 1):
            generation = self._generation
            resp = await self._send(method, uri, body, timeout)
            if resp.status in (401, 403) and authenticated and attempt == 0 and self.user:
                resp.release()
                if resp.status == 401 and await self._relogin(generation):
                    continue
                raise SourceError("auth", f"{method} {uri}: HTTP {resp.status} "
                                          f"({'refused' if resp.status == 403 else 'credentials not accepted'})")
            if resp.status in (401, 403):
                resp.release()
                raise SourceError("auth", f"{method} {uri}: HTTP {resp.status}"
                                          + ("" if self.user else " (no credentials configured)"))
            headers = {k: v for k, v in resp.headers.items()}
            if resp.status == 204:
                resp.release()
                return resp.status, None, headers
            if resp.status >= 300:  # an error page need not be JSON (sushy-static's is HTML): the status says it
                try:
                    return resp.status, await self._read_json(resp, uri), headers
                except SourceError as exc:
                    if exc.kind != "decode":
                        raise
                    return resp.status, None, headers
            return resp.status, await self._read_json(resp, uri), headers
        raise AssertionError("unreachable")

    async def get(self, uri: str, authenticated: bool = True) -> dict[str, Any]:
        """A resource as a JSON object; NotFound on 404, SourceError for anything but 200."""
        status, data, _ = await self.request("GET", uri, authenticated=authenticated)
        if status == 404:
            raise NotFound(uri)
        if status != 200:
            raise SourceError("protocol", f"GET {uri}: HTTP {status}")
        if not isinstance(data, dict):
            raise SourceError("decode", f"GET {uri}: reply is not a JSON object")
        return data

    async def post(self, uri: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        return await self.request("POST", uri, body)

    async def delete(self, uri: str) -> int:
        status, _, _ = await self.request("DELETE", uri)
        return status

    # -- sessions -----------------------------------------------------------------------

    async def _relogin(self, generation: int) -> bool:
        """Log in (again) after a 401; True when there is a fresh credential to retry with."""
        if self.auth != "session":
            return False
        async with self._login_lock:
            if self._generation != generation and self._token:
                return True  # another request logged in meanwhile
            self._token = None
            return await self.login()

    async def login(self) -> bool:
        """POST a session; falls back to Basic where the service has no SessionService. Refused: SourceError(auth).

        After a refused login the next try waits (doubling up to 5 min): a BMC locks an account after a few
        bad logins, and an agent polling twice a second must never be what locks it.
        """
        now = time.monotonic()
        if now < self._login_blocked_until:
            raise SourceError("auth", f"{self.origin}: login refused earlier; next try in "
                                      f"{self._login_blocked_until - now:.0f}s")
        if not self.user:
            return False
        sessions = self.sessions_uri or await self._find_sessions()
        if sessions is None:
            return self._fall_back("the service root links no SessionService")
        resp = await self._send("POST", sessions, {"UserName": self.user, "Password": self._password or ""})
        status, token, location = resp.status, resp.headers.get("X-Auth-Token"), resp.headers.get("Location")
        resp.release()
        if status in (401, 403):
            self._login_blocked_until = time.monotonic() + self._login_delay
            self._login_delay = min(self._login_delay * 2, LOGIN_BACKOFF_MAX_S)
            raise SourceError("auth", f"{self.origin}: login as {self.user!r} refused (HTTP {status})")
        if status in (404, 405, 501):
            return self._fall_back(f"POST {sessions} answered {status}")
        if status not in (200, 201) or not token:
            raise SourceError("protocol", f"{self.origin}: login answered HTTP {status}"
                                          + ("" if token else " without X-Auth-Token"))
        self._token, self._session_uri = token, location
        self._generation += 1
        self._login_delay = self.login_retry_s
        self.stats.logins += 1
        return True

    def _fall_back(self, why: str) -> bool:
        self.auth = "basic"
        self.stats.auth_fallbacks.append(why)
        return True

    async def _find_sessions(self) -> str | None:
        root = await self.get(SERVICE_ROOT, authenticated=False)
        link = (root.get("Links") or {}).get("Sessions") or {}
        uri = link.get("@odata.id") if isinstance(link, dict) else None
        self.sessions_uri = uri if isinstance(uri, str) else None
        return self.sessions_uri

    async def logout(self) -> None:
        if self._token and self._session_uri:
            try:
                await self._send("DELETE", self._session_uri, timeout=self.request_timeout)
            except SourceError:
                pass  # the session expires by itself
        self._token = self._session_uri = None

    # -- server-sent events ------------------------------------------------------------

    async def events(self, uri: str, on_open: Callable[[], Any] | None = None) -> AsyncIterator[dict[str, Any]]:
        """The JSON payloads of an SSE stream (ServerSentEventUri), until it ends.

        Every way it can fail is an `EventStreamError` (a `SourceError` whose `reason` names it): the stream could
        not open (its kind), a line or an event over `MAX_EVENT_BYTES` (`too_long`), a line that is not UTF-8
        (`not_utf8`), data that is not a JSON object (`not_json`), the connection lost (`connection`), or
        anything else the HTTP stack raised (`unexpected`). Why every way: a 48 MiB line made aiohttp's line
        reader raise `LineTooLong`, which is no `ClientError`; it escaped and ended the watch silently, with
        no reconnect and the stream still counted up. Lines are split here, from raw chunks, so no line can
        grow past the bound in a buffer first; a record that cannot be read ends the stream (a source sending
        garbage does not keep its fast path), and the watch's reconnect polls for whatever it said.

        `on_open` is called once the service accepted the stream (before any event arrives)."""
        for attempt in (0, 1):
            generation = self._generation
            resp = await self._send("GET", uri, stream=True)
            if resp.status == 401 and attempt == 0 and self.user:
                resp.release()
                if await self._relogin(generation):
                    continue
            break
        if resp.status != 200:
            resp.release()
            kind = "auth" if resp.status in (401, 403) else "protocol"
            raise EventStreamError(kind, f"GET {uri} (event stream): HTTP {resp.status}")
        if on_open is not None:
            on_open()
        try:
            async for data in _sse_data(resp.content, uri):
                if not data.strip():
                    continue  # an empty data field: a keep-alive
                try:
                    obj = json.loads(data)
                except (ValueError, RecursionError):
                    raise EventStreamError("not_json", f"event stream {uri}: an event's data is not JSON") from None
                if not isinstance(obj, dict):
                    raise EventStreamError("not_json", f"event stream {uri}: an event's data is not a JSON object")
                yield obj
        except SourceError:
            raise
        except asyncio.TimeoutError:
            raise EventStreamError("timeout", f"event stream {uri}: timed out") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise EventStreamError("connection", f"event stream {uri}: {type(exc).__name__}: {exc}") from None
        except Exception as exc:  # the HTTP stack's own errors (LineTooLong...): the stream is over, say why
            raise EventStreamError("unexpected", f"event stream {uri}: {type(exc).__name__}: {exc}") from None
        finally:
            resp.release()

    async def close(self) -> None:
        try:
            await self.logout()
        finally:
            if self._http is not None:
                await self._http.close()
                self._http = None
