"""SNMP v3 (USM) through pysnmp's engine, values converted to what the v2c codec returns.

Why a module of its own: pysnmp, pysmi and the crypto they load cost about
30 MB of resident memory and a third of a second of start-up; an agent whose
PDUs all speak v2c never imports this module (exporters/snmp/client.py
imports it only for a v3 device).
"""

from __future__ import annotations

from typing import Any

from pysnmp.hlapi.v3arch.asyncio import (ContextData, ObjectIdentity, ObjectType, SnmpEngine,
                                         UdpTransportTarget, UsmUserData, bulk_cmd, get_cmd, set_cmd)
from pysnmp.hlapi.v3arch.asyncio import auth as _auth
from pysnmp.proto import rfc1902, rfc1905

from exporters.snmp import v2c as snmp_v2c
from exporters.model import SourceError
from exporters.snmp.client import SnmpCredentials, Varbinds
from exporters.snmp.v2c import END, Oid

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



def usm_user(credentials: SnmpCredentials) -> UsmUserData:
    """The USM user of v3 credentials (SnmpCredentials.check() has vetted version and user)."""
    c = credentials
    try:
        auth_proto = AUTH_PROTOCOLS[c.auth_protocol.upper()] if c.auth_key else _auth.usmNoAuthProtocol
        priv_proto = PRIV_PROTOCOLS[c.priv_protocol.upper()] if c.priv_key else _auth.usmNoPrivProtocol
    except KeyError as exc:
        raise SourceError("config", f"unknown SNMP v3 protocol {exc.args[0]!r}; auth {sorted(AUTH_PROTOCOLS)}, "
                                    f"priv {sorted(PRIV_PROTOCOLS)}") from None
    return UsmUserData(c.v3_user, authKey=c.auth_key, privKey=c.priv_key,
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


class EngineBackend:
    """pysnmp's engine (v3, USM): one engine and one transport per device, values converted to Python."""

    def __init__(self, host: str, port: int, credentials: SnmpCredentials, timeout: float, retries: int):
        self.where = f"{host}:{port}"
        self._host, self._port = host, port
        self._auth = usm_user(credentials)
        self._context = credentials.context.encode()
        self._timeout, self._retries = timeout, retries
        self._engine: SnmpEngine | None = None
        self._target: UdpTransportTarget | None = None

    async def _ctx(self) -> tuple[SnmpEngine, UdpTransportTarget, ContextData]:
        if self._engine is None:
            self._engine = SnmpEngine()
        if self._target is None:
            self._target = await UdpTransportTarget.create((self._host, self._port), timeout=self._timeout,
                                                           retries=self._retries)
        return self._engine, self._target, ContextData(contextName=self._context)

    def _result(self, answer: tuple) -> tuple[int, int, Varbinds]:
        ind, status, index, vbs = answer
        if ind:
            raise _error(self.where, ind)
        out = [(tuple(n), END if isinstance(v, _END) else to_python(v)) for n, v in vbs]
        for oid, _ in out:  # the same bounds as the v2c codec (RFC 2578 3.5) before an OID becomes a label
            if len(oid) > snmp_v2c.MAX_OID_LENGTH or any(s > snmp_v2c.MAX_SUBID for s in oid):
                raise SourceError("decode", f"{self.where}: response OID beyond RFC 2578 bounds "
                                            f"({len(oid)} sub-identifiers)")
        return int(status), int(index), out

    async def get(self, oids: list[Oid]) -> tuple[int, int, Varbinds]:
        engine, target, ctx = await self._ctx()
        return self._result(await get_cmd(engine, self._auth, target, ctx,
                                          *(ObjectType(ObjectIdentity(rfc1902.ObjectName(o))) for o in oids),
                                          lookupMib=False))

    async def bulk(self, oids: list[Oid], max_repetitions: int) -> tuple[int, int, Varbinds]:
        engine, target, ctx = await self._ctx()
        return self._result(await bulk_cmd(engine, self._auth, target, ctx, 0, max_repetitions,
                                           *(ObjectType(ObjectIdentity(rfc1902.ObjectName(o))) for o in oids),
                                           lookupMib=False))

    async def set_int(self, oid: Oid, value: int) -> tuple[int, int, Varbinds]:
        engine, target, ctx = await self._ctx()
        return self._result(await set_cmd(engine, self._auth, target, ctx,
                                          ObjectType(ObjectIdentity(rfc1902.ObjectName(oid)),
                                                     rfc1902.Integer32(value)), lookupMib=False))

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close_dispatcher()
            self._engine = None
            self._target = None
