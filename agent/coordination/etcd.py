"""An asyncio client of etcd v3 through etcd's own JSON gateway (`/v3/...`), on aiohttp.

Why the gateway and not a gRPC library: the agent is one asyncio loop and
aiohttp is already its HTTP stack, so every call here is a coroutine with a
deadline and the watch is one streamed response read by the loop, with no
thread and no second network stack. The gateway is part of etcd itself
(grpc-gateway, served on the client port), documented and stable across 3.4+;
the PyPI clients are either gRPC (grpcio: a large native wheel, and a thread
pool the loop would wait on) or synchronous over `requests` (etcd3gw: every
call on a thread, a watch thread per watch).

Endpoints fail over: a request that cannot reach its member or times out is
tried on the next one within the same call, and the member that answered
becomes the current one (the watch follows it: `endpoint_changed`). Keys and
values are bytes on the wire as base64; this module speaks str keys and
bytes values.

With a user (etcd auth, agent.coordination.etcd_auth: one user per node) the
client authenticates once (`/v3/auth/authenticate`) and sends the token on
every call and on the watch. etcd's simple tokens expire (`--auth-token-ttl`,
5 min by default) and a restarted member forgets them: a call told "invalid
auth token" authenticates again and is tried once more. A refused password or
a permission denied is an `EtcdAuthError` naming the user: no other member
would answer differently, so no failover is tried.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from dataclasses import dataclass
from typing import Any, AsyncIterator

import aiohttp

MAX_WATCH_MESSAGE = 8 << 20  # one watch response (events of one revision batch) at most


class EtcdError(Exception):
    """etcd could not be asked (every endpoint failed or timed out) or answered an error."""


class EtcdAuthError(EtcdError):
    """etcd refused this client's credentials or denied it the key: fix the config or the role, not the network."""


class _TokenInvalid(EtcdError):
    """The token expired or the member does not know it: authenticate again."""


# gRPC status codes etcd's gateway puts in an error body
_UNAUTHENTICATED, _PERMISSION_DENIED = 16, 7
_AUTH_REFUSED = ("authentication failed", "user name is empty", "authentication is not enabled",
                 "permission denied", "user name not found")
_AUTH_RETRY = ("invalid auth token", "revision of auth store is old")


def _auth_problem(message: str, code: int | None, user: str | None) -> EtcdError | None:
    """The auth error an etcd error message means (None: not an auth error)."""
    if code == _UNAUTHENTICATED or any(m in message for m in _AUTH_RETRY):
        return _TokenInvalid(message)
    if code == _PERMISSION_DENIED or any(m in message for m in _AUTH_REFUSED):
        who = f"etcd user {user!r}" if user else "no etcd user configured (coordination.etcd.user)"
        return EtcdAuthError(f"{who}: {message}")
    return None


class LeaseGone(EtcdError):
    """The lease expired or was revoked: everything held under it is gone."""


class WatchCompacted(EtcdError):
    """The watch's start revision was compacted away: re-read the state, then watch again."""


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: str | None) -> bytes:
    return base64.b64decode(s) if s else b""


def prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with `prefix` (etcd's "prefix" range)."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return raw.decode()


@dataclass(frozen=True, slots=True)
class KV:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "KV":
        return cls(_unb64(d.get("key")).decode(), _unb64(d.get("value")), int(d.get("create_revision", 0)),
                   int(d.get("mod_revision", 0)), int(d.get("lease", 0)))

    def json(self) -> Any:
        return json.loads(self.value)


@dataclass(frozen=True, slots=True)
class Event:
    type: str  # PUT | DELETE
    kv: KV


# -- txn building blocks ------------------------------------------------------------------------------------

def cmp_create(key: str, revision: int, result: str = "EQUAL") -> dict[str, Any]:
    return {"key": _b64(key), "target": "CREATE", "result": result, "create_revision": str(revision)}


def cmp_mod(key: str, revision: int, result: str = "EQUAL") -> dict[str, Any]:
    return {"key": _b64(key), "target": "MOD", "result": result, "mod_revision": str(revision)}


def cmp_value(key: str, value: bytes | str, result: str = "EQUAL") -> dict[str, Any]:
    return {"key": _b64(key), "target": "VALUE", "result": result, "value": _b64(value)}


def op_put(key: str, value: bytes | str, lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def op_delete(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


def op_get(key: str) -> dict[str, Any]:
    return {"request_range": {"key": _b64(key)}}


class EtcdClient:
    def __init__(self, endpoints: list[str], timeout: float = 1.0, tls: Any = None, start: int = 0,
                 user: str | None = None, password: str | None = None):
        if not endpoints:
            raise ValueError("at least one etcd endpoint")
        if (user is None) != (password is None):
            raise ValueError("an etcd user and its password go together")
        self.user, self._password = user, password
        self._token: str | None = None
        self._auth_lock = asyncio.Lock()
        self.authentications = 0
        self.endpoints = list(endpoints)
        self.current = start % len(self.endpoints)
        self.timeout = timeout
        self._ssl = _ssl_context(tls) if tls is not None else None
        self._session: aiohttp.ClientSession | None = None
        self.endpoint_changed = asyncio.Event()  # set when requests moved to another member
        self.requests = 0

    @property
    def endpoint(self) -> str:
        return self.endpoints[self.current]

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16, ssl=self._ssl))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def rotate(self) -> None:
        """Move to the next member (a request failed, or its watch went quiet on a member that stopped)."""
        self.current = (self.current + 1) % len(self.endpoints)
        self.endpoint_changed.set()

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST one gateway call; each member is tried once, within `timeout` each. With a user, under its
        token; a token etcd no longer knows is replaced once (authenticate again) and the call tried again."""
        token = await self._ensure_token(None)
        try:
            return await self._post(path, body, token)
        except _TokenInvalid:
            token = await self._ensure_token(token)
        try:
            return await self._post(path, body, token)
        except _TokenInvalid as exc:
            raise EtcdAuthError(f"etcd user {self.user!r}: a fresh token was refused too: {exc}") from None

    async def _ensure_token(self, stale: str | None) -> str | None:
        """The token to send: None without a user; a new one when there is none yet or `stale` was refused
        (concurrent calls that all saw it refused authenticate once between them)."""
        if self.user is None:
            return None
        async with self._auth_lock:
            if self._token is None or self._token == stale:
                self._token = None
                data = await self._post("auth/authenticate", {"name": self.user, "password": self._password}, None)
                token = data.get("token")
                if not isinstance(token, str) or not token:
                    raise EtcdAuthError(f"etcd user {self.user!r}: authenticate answered no token")
                self._token = token
                self.authentications += 1
            return self._token

    def _forget(self, token: str | None) -> None:
        if token is not None and self._token == token:
            self._token = None

    async def _post(self, path: str, body: dict[str, Any], token: str | None) -> dict[str, Any]:
        errors: list[str] = []
        headers = {"Authorization": token} if token else None
        for _ in range(len(self.endpoints)):
            url = f"{self.endpoint}/v3/{path}"
            self.requests += 1
            try:
                async with self._http().post(url, json=body, headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                    text = await r.text()
                    if r.status != 200:
                        problem = _auth_problem(*_error_of(text), self.user)
                        if problem is not None:
                            raise problem
                        raise EtcdError(f"{url}: HTTP {r.status}: {text[:200]}")
                    data = json.loads(text)
            except (_TokenInvalid, EtcdAuthError):
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, EtcdError) as exc:
                errors.append(f"{url}: {type(exc).__name__}: {exc}"[:300])
                self.rotate()
                continue
            if "error" in data and "header" not in data:
                raise EtcdError(f"{url}: {data.get('error') or data.get('message')}")
            return data
        raise EtcdError("no etcd member answered: " + "; ".join(errors))

    # -- kv ---------------------------------------------------------------------------------------------

    async def get_prefix(self, prefix: str) -> tuple[list[KV], int]:
        data = await self.call("kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})
        return [KV.from_json(kv) for kv in data.get("kvs", [])], int(data["header"]["revision"])

    async def get(self, key: str) -> KV | None:
        data = await self.call("kv/range", {"key": _b64(key)})
        kvs = data.get("kvs") or []
        return KV.from_json(kvs[0]) if kvs else None

    async def put(self, key: str, value: bytes | str, lease: int = 0) -> int:
        data = await self.call("kv/put", op_put(key, value, lease)["request_put"])
        return int(data["header"]["revision"])

    async def delete(self, key: str) -> None:
        await self.call("kv/deleterange", {"key": _b64(key)})

    async def txn(self, compare: list[dict], success: list[dict], failure: list[dict] | None = None
                  ) -> tuple[bool, list[dict], int]:
        """(succeeded, responses, revision) of one transaction: all compares hold -> success ops, else failure ops."""
        data = await self.call("kv/txn", {"compare": compare, "success": success, "failure": failure or []})
        return bool(data.get("succeeded")), data.get("responses", []), int(data["header"]["revision"])

    # -- leases -----------------------------------------------------------------------------------------

    async def lease_grant(self, ttl: float) -> int:
        data = await self.call("lease/grant", {"TTL": str(max(1, round(ttl)))})
        return int(data["ID"])

    async def lease_keepalive(self, lease: int) -> float:
        """Refresh a lease; its new TTL. LeaseGone when it expired or was revoked."""
        data = await self.call("lease/keepalive", {"ID": str(lease)})
        ttl = int((data.get("result") or data).get("TTL", 0))
        if ttl <= 0:
            raise LeaseGone(f"lease {lease:x} expired")
        return float(ttl)

    async def lease_revoke(self, lease: int) -> None:
        await self.call("lease/revoke", {"ID": str(lease)})

    # -- watch ------------------------------------------------------------------------------------------

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[list[Event]]:
        """Events under `prefix` from `start_revision` on, one list per response, on the current member.

        Ends (EtcdError) when the stream breaks or the client moved to another member; the caller
        watches again from the revision after the last one it saw.
        """
        token = await self._ensure_token(None)
        url = f"{self.endpoint}/v3/watch"
        body = {"create_request": {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)),
                                   "start_revision": str(start_revision)}}
        self.endpoint_changed.clear()
        try:
            async with self._http().post(url, json=body, headers={"Authorization": token} if token else None,
                                         timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout)) as resp:
                if resp.status != 200:
                    raise EtcdError(f"{url}: HTTP {resp.status}")
                buf = b""
                while True:
                    chunk = await _read_or_moved(resp, self.endpoint_changed)
                    if chunk is None:
                        raise EtcdError(f"{url}: client moved to {self.endpoint}")
                    if not chunk:
                        raise EtcdError(f"{url}: watch stream closed")
                    buf += chunk
                    if len(buf) > MAX_WATCH_MESSAGE:
                        raise EtcdError(f"{url}: watch message over {MAX_WATCH_MESSAGE} bytes")
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        try:
                            events = _watch_events(line, url, self.user)
                        except _TokenInvalid as exc:  # the next watch authenticates again
                            self._forget(token)
                            raise EtcdError(f"{url}: watch refused the token, authenticating again: {exc}") from None
                        if events:
                            yield events
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            self.rotate()
            raise EtcdError(f"{url}: {type(exc).__name__}: {exc}") from None


async def _read_or_moved(resp: aiohttp.ClientResponse, moved: asyncio.Event) -> bytes | None:
    """The next chunk of a streamed response, or None once `moved` is set (the watch must follow)."""
    read = asyncio.ensure_future(resp.content.readany())
    flag = asyncio.ensure_future(moved.wait())
    try:
        done, _ = await asyncio.wait({read, flag}, return_when=asyncio.FIRST_COMPLETED)
        return read.result() if read in done else None
    finally:
        for f in (read, flag):
            if not f.done():
                f.cancel()
            f.add_done_callback(_retrieved)


def _retrieved(f: asyncio.Future) -> None:
    """Mark a side future's outcome seen (a stream closed while the watch stopped is no error to report)."""
    if not f.cancelled():
        f.exception()


def _error_of(text: str) -> tuple[str, int | None]:
    """(message, gRPC code) of a gateway error body; the raw text when it is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        return text[:200], None
    if not isinstance(data, dict):
        return text[:200], None
    code = data.get("code")
    return str(data.get("error") or data.get("message") or text[:200])[:200], code if isinstance(code, int) else None


def _watch_events(line: bytes, url: str, user: str | None = None) -> list[Event]:
    if not line.strip():
        return []
    try:
        msg = json.loads(line)
    except ValueError:
        raise EtcdError(f"{url}: watch sent something that is not JSON") from None
    if "error" in msg:
        raise EtcdError(f"{url}: watch error: {msg['error']}")
    res = msg.get("result") or {}
    if int(res.get("compact_revision", 0) or 0) > 0:
        raise WatchCompacted(f"{url}: revision compacted (now {res['compact_revision']})")
    if res.get("canceled"):
        reason = str(res.get("cancel_reason", ""))[:200]
        problem = _auth_problem(reason, None, user)
        raise problem if problem is not None else EtcdError(f"{url}: watch canceled: {reason}")
    return [Event(e.get("type", "PUT"), KV.from_json(e.get("kv", {}))) for e in res.get("events", [])]


def _ssl_context(tls: Any) -> ssl.SSLContext:
    """Verified TLS (never skipped): the CA given, and a client certificate when configured."""
    ctx = ssl.create_default_context(cafile=str(tls.ca_file))
    if tls.cert_file is not None:
        ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    return ctx
