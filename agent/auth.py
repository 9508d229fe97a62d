"""The one bearer-token check of the agent's HTTP API, and who the caller is.

Why one: every route that needs a token (reload, approve, breaker reset,
incidents, journal, the webhook) goes through `caller`, so a hardening (ASCII
only, constant time, several named tokens) applies everywhere at once.

How a route uses it::

    @requires_admin(tokens)
    async def handler(request: web.Request, who: str) -> web.Response: ...
    # who: the token's name; under mTLS `<token name> (<certificate subject>)`

`tokens` is a mapping name -> SecretStr, a single SecretStr (named "admin"),
or a callable returning either, so a reload (token rotation) applies to the
next request. Reads that a config may open take `open_=lambda: cfg.auth.open_reads`.
"""

from __future__ import annotations

import hmac
from typing import Awaitable, Callable, Mapping, Union

from aiohttp import web
from pydantic import SecretStr

Tokens = Union[Mapping[str, SecretStr], SecretStr, None]
TokenSource = Union[Tokens, Callable[[], Tokens]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
WhoHandler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]
Flag = Union[bool, Callable[[], bool]]


def token_map(source: TokenSource, default_name: str = "admin") -> dict[str, SecretStr]:
    """The current tokens as name -> secret (empty tokens dropped)."""
    tokens = source() if callable(source) else source
    if tokens is None:
        return {}
    if isinstance(tokens, SecretStr):
        tokens = {default_name: tokens}
    return {name: tok for name, tok in tokens.items() if tok is not None and tok.get_secret_value()}


_RDN_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
              "localityName": "L", "stateOrProvinceName": "ST", "domainComponent": "DC"}


def client_subject(request: web.Request) -> str | None:
    """The verified client certificate's subject (`CN=...,O=...`), when the listener requires one."""
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    parts = [f"{_RDN_SHORT.get(k, k)}={v}" for rdn in cert.get("subject", ()) for k, v in rdn]
    return ",".join(parts) or None


def caller(request: web.Request, tokens: Mapping[str, SecretStr]) -> str | None:
    """Who sent this request: the name of the bearer token it carries, None when it carries no valid token.

    Under mTLS it is `<token name> (<certificate subject>)`: the token names the person (or system) that
    holds it, the certificate the machine it came from; an audit needs both, so neither replaces the other.

    The header must be ASCII (a non-UTF-8 or non-ASCII header is simply not a valid token, a 401,
    never an exception); every configured token is compared, each in constant time.
    """
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    try:
        raw = given.strip().encode("ascii")
    except UnicodeEncodeError:
        return None
    if not raw:
        return None
    match = None
    for name, token in tokens.items():
        if hmac.compare_digest(raw, token.get_secret_value().encode()) and match is None:
            match = name
    if match is None:
        return None
    subject = client_subject(request)
    return f"{match} ({subject})" if subject else match


def unauthorized() -> web.Response:
    return web.json_response({"error": "missing or wrong bearer token"}, status=401,
                             headers={"WWW-Authenticate": "Bearer"})


def authorize(request: web.Request, tokens: TokenSource, open_: Flag = False) -> str | web.Response:
    """`who` when the request may proceed, else the 401/403 response to return."""
    if open_() if callable(open_) else open_:
        return caller(request, token_map(tokens)) or "anonymous"
    current = token_map(tokens)
    if not current:
        return web.json_response({"error": "no admin token configured (auth.admin_tokens)"}, status=403)
    who = caller(request, current)
    return who if who is not None else unauthorized()


def requires_admin(tokens: TokenSource, open_: Flag = False) -> Callable[[WhoHandler], Handler]:
    """Route decorator: answers 401/403 itself; otherwise calls `handler(request, who)`."""
    def wrap(handler: WhoHandler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            who = authorize(request, tokens, open_)
            if isinstance(who, web.Response):
                return who
            return await handler(request, who)
        guarded.__name__ = getattr(handler, "__name__", "guarded")
        guarded.__doc__ = handler.__doc__
        return guarded
    return wrap
