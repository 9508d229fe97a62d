"""A small asyncio SNMP client on pysnmp 7: multi-column GETBULK walks, GET and SET, numeric OIDs only.

Why its own module: the collector, the outlet switch and the probe all talk
to a device the same way, and every transport failure must become one
`SourceError` kind (timeout, auth, protocol) that `supernode_source_errors_total`
can count. Walking several columns in one GETBULK (snmp_exporter walks one
subtree per request chain) keeps the request count per poll low.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pysnmp.hlapi.v3arch.asyncio import (CommunityData, ContextData, ObjectIdentity, ObjectType, SnmpEngine,
                                         UdpTransportTarget, UsmUserData, bulk_cmd, get_cmd, set_cmd)
from pysnmp.hlapi.v3arch.asyncio import auth as _auth
from pysnmp.proto import rfc1902, rfc1905

from exporters.model import SourceError

AUTH_PROTOCOLS = {
    "MD5": _auth.usmHMACMD5AuthProtocol, "SHA": _auth.usmHMACSHAAuthProtocol,
    "SHA224": _auth.usmHMAC128SHA224AuthProtocol, "SHA256": _auth.usmHMAC192SHA256AuthProtocol,
    "SHA384": _auth.usmHMAC256SHA384AuthProtocol, "SHA512": _auth.usmHMAC384SHA512AuthProtocol,
}
PRIV_PROTOCOLS = {
    "DES": _auth.usmDESPrivProtocol, "AES": _auth.usmAesCfb128Protocol,
    "AES192": _auth.usmAesCfb192Protocol, "AES256": _auth.usmAesCfb256Protocol,
}
_END = (rfc1905.EndOfMibView, rfc1905.NoSuchObject, rfc1905.NoSuchInstance)
_AUTH_WORDS = ("digest", "unknownusername", "unknown user", "decrypt", "authentication", "unsupportedseclevel",
               "notintimewindow", "unknownengineid", "wrongdigest", "unavailable security")


@dataclass(frozen=True)
class SnmpCredentials:
    """Plain secret values (the agent resolves secret names to these); never logged."""

    version: str = "2c"
    community: str | None = None
    v3_user: str | None = None
    auth_key: str | None = None
    priv_key: str | None = None
    auth_protocol: str = "SHA"
    priv_protocol: str = "AES"
    context: str = ""

    def __repr__(self) -> str:  # secrets stay out of logs and tracebacks
        return f"SnmpCredentials(version={self.version!r}, v3_user={self.v3_user!r})"

    def auth_data(self) -> CommunityData | UsmUserData:
        if self.version == "2c":
            if not self.community:
                raise SourceError("config", "SNMP v2c needs a community")
            return CommunityData(self.community, mpModel=1)
        if self.version != "3":
            raise SourceError("config", f"SNMP version {self.version!r} not supported (2c or 3)")
        if not self.v3_user:
            raise SourceError("config", "SNMP v3 needs a user")
        try:
            auth_proto = AUTH_PROTOCOLS[self.auth_protocol.upper()] if self.auth_key else _auth.usmNoAuthProtocol
            priv_proto = PRIV_PROTOCOLS[self.priv_protocol.upper()] if self.priv_key else _auth.usmNoPrivProtocol
        except KeyError as exc:
            raise SourceError("config", f"unknown SNMP v3 protocol {exc.args[0]!r}; auth {sorted(AUTH_PROTOCOLS)}, "
                                        f"priv {sorted(PRIV_PROTOCOLS)}") from None
        return UsmUserData(self.v3_user, authKey=self.auth_key, privKey=self.priv_key,
                           authProtocol=auth_proto, privProtocol=priv_proto)


def _error(where: str, indication: Any) -> SourceError:
    text = str(indication)
    low = text.lower().replace(" ", "")
    if "timeout" in low or "noresponse" in low or "beforetimeout" in low:
        return SourceError("timeout", f"{where}: no SNMP response before timeout ({text})")
    if any(w.replace(" ", "") in low for w in _AUTH_WORDS):
        return SourceError("auth", f"{where}: SNMP authentication failed ({text})")
    return SourceError("protocol", f"{where}: {text}")


def to_python(value: Any) -> int | str | None:
    """A varbind value as int (numbers) or str (strings); None for noSuch*/endOfMibView."""
    if isinstance(value, _END):
        return None
    if isinstance(value, rfc1902.OctetString):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.hex()
    try:
        return int(value)
    except (TypeError, ValueError):
        return str(value)


class SnmpClient:
    """One engine and one transport per device; counts requests (for the benchmark and the probe)."""

    def __init__(self, host: str, port: int, credentials: SnmpCredentials, timeout: float = 1.0, retries: int = 1):
        self.where = f"{host}:{port}"
        self._host, self._port = host, port
        self._creds = credentials
        self._auth = credentials.auth_data()
        self._timeout, self._retries = timeout, retries
        self._engine: SnmpEngine | None = None
        self._target: UdpTransportTarget | None = None
        self.requests = 0

    async def _ctx(self) -> tuple[SnmpEngine, UdpTransportTarget, ContextData]:
        if self._engine is None:
            self._engine = SnmpEngine()
        if self._target is None:
            self._target = await UdpTransportTarget.create((self._host, self._port), timeout=self._timeout,
                                                           retries=self._retries)
        return self._engine, self._target, ContextData(contextName=self._creds.context.encode())

    async def get(self, oids: list[str]) -> dict[str, int | str | None]:
        engine, target, ctx = await self._ctx()
        self.requests += 1
        ind, status, index, vbs = await get_cmd(engine, self._auth, target, ctx,
                                                *(ObjectType(ObjectIdentity(o)) for o in oids), lookupMib=False)
        if ind:
            raise _error(self.where, ind)
        if int(status):
            raise SourceError("protocol", f"{self.where}: GET error {status.prettyPrint()} at {index}")
        return {str(vb[0]): to_python(vb[1]) for vb in vbs}

    async def set_int(self, oid: str, value: int) -> None:
        engine, target, ctx = await self._ctx()
        self.requests += 1
        ind, status, index, _ = await set_cmd(engine, self._auth, target, ctx,
                                              ObjectType(ObjectIdentity(oid), rfc1902.Integer32(value)),
                                              lookupMib=False)
        if ind:
            raise _error(self.where, ind)
        if int(status):
            raise SourceError("protocol", f"{self.where}: SET {oid}={value} refused: {status.prettyPrint()}")

    async def walk_columns(self, oids: list[str], max_repetitions: int = 10) -> dict[str, dict[tuple[int, ...], Any]]:
        """Walk several table columns together; returns column oid -> {index tuple: value}.

        Each GETBULK carries the current position of every column still
        inside its subtree, so a 3-column table of 24 rows with
        max-repetitions 10 costs 3 requests instead of 9.
        """
        engine, target, ctx = await self._ctx()
        out: dict[str, dict[tuple[int, ...], Any]] = {o: {} for o in oids}
        prefixes = {o: tuple(int(p) for p in o.split(".")) for o in oids}
        cursor = {o: prefixes[o] for o in oids}
        active = list(oids)
        while active:
            self.requests += 1
            ind, status, index, vbs = await bulk_cmd(
                engine, self._auth, target, ctx, 0, max_repetitions,
                *(ObjectType(ObjectIdentity(rfc1902.ObjectName(cursor[o]))) for o in active), lookupMib=False)
            if ind:
                raise _error(self.where, ind)
            if int(status):
                raise SourceError("protocol", f"{self.where}: GETBULK error {status.prettyPrint()} at {index}")
            if not vbs:
                raise SourceError("protocol", f"{self.where}: empty GETBULK response")
            done: set[str] = set()
            for i, (name, value) in enumerate(vbs):
                col = active[i % len(active)]
                if col in done:
                    continue
                oid = tuple(name)
                prefix = prefixes[col]
                if isinstance(value, _END) or oid[:len(prefix)] != prefix or oid <= cursor[col]:
                    done.add(col)
                    continue
                out[col][oid[len(prefix):]] = to_python(value)
                cursor[col] = oid
            active = [c for c in active if c not in done]
        return out

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close_dispatcher()
            self._engine = None
            self._target = None
