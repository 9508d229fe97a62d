"""A minimal SNMP v2c agent on 127.0.0.1 serving a sorted OID -> value table (GET, GETNEXT, GETBULK, SET).

Why not snmpsim: the simulated PDU's values follow the rack model every
tick and outlets switch on SET, so the table is rebuilt from the model and
SETs call back into the device. pysnmp's message API decodes each request;
a read's answer is put together from each varbind's BER bytes, encoded once
per table (`OidTable.encoded`): building the answer with pysnmp's objects
(a pyasn1 object per varbind, every request) was a fifth of a test process's
CPU where an agent walks the simulated PDU every second. A SET still takes
pysnmp's path (`_answer_with_pysnmp`), the reference the fast path is tested
against byte for byte. asyncio's datagram endpoint gives the bound port
(port 0 = pick one).
A wrong community gets no answer, as on real agents (the client times out).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from typing import Any, Callable

from pyasn1.codec.ber import decoder, encoder
from pyasn1.type import univ
from pysnmp.proto import api, rfc1902, rfc1905

Oid = tuple[int, ...]
# Called for a SET of one varbind: returns the value to answer, or raises SetRefused.
SetHandler = Callable[[Oid, Any], Any]


class SetRefused(Exception):
    def __init__(self, status: int):
        super().__init__(status)
        self.status = status  # 17 notWritable, 10 wrongValue, ...


class OidTable:
    """A sorted snapshot of the served values; replaced as a whole so readers never see half an update."""

    def __init__(self, items: dict[Oid, Any] | None = None):
        items = items or {}
        self.keys: list[Oid] = sorted(items)
        self.values: dict[Oid, Any] = items
        self.encoded: dict[Oid, bytes] = {}  # oid -> its varbind's BER bytes, filled as requests name them

    def get(self, oid: Oid) -> Any:
        return self.values.get(oid)

    def next(self, oid: Oid) -> tuple[Oid, Any] | None:
        i = bisect.bisect_right(self.keys, oid)
        if i >= len(self.keys):
            return None
        k = self.keys[i]
        return k, self.values[k]


class SnmpAgent(asyncio.DatagramProtocol):
    def __init__(self, community: str, on_set: SetHandler | None = None):
        self.community = community
        self.table = OidTable()
        # A device whose values follow the model sets `pending` (a builder of its next table) at each tick instead
        # of a table: built at the first request after it, never for a tick no request saw. Why: building the
        # table (a pysnmp object per OID) at every 0.1 s tick was a third of a test process's CPU for a device
        # the agents read once a second.
        self.pending: Callable[[], OidTable] | None = None
        self.on_set = on_set
        self.offline = False
        self.requests = 0
        self.peers: dict[tuple, float] = {}  # client address -> monotonic time of its last request
        self._transport: asyncio.DatagramTransport | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        if host != "127.0.0.1":
            raise ValueError("the simulated SNMP agent binds to 127.0.0.1 only")
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(host, port))
        return self._transport.get_extra_info("sockname")[:2]

    def clients(self, within: float) -> int:
        """Client addresses that sent a request in the last `within` seconds."""
        now = time.monotonic()
        return sum(1 for t in list(self.peers.values()) if now - t <= within)

    def stop(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.offline:
            return
        self.peers[addr] = time.monotonic()
        try:
            rsp = self._answer(data)
        except Exception:  # a malformed datagram is dropped, like a real agent would
            return
        if rsp is not None and self._transport is not None:
            self._transport.sendto(rsp, addr)

    def _request(self, data: bytes) -> tuple[Any, Any, bytes] | None:
        """(protocol module, decoded message, community) of a v2c request with our community; None: no answer."""
        version = int(api.decodeMessageVersion(data))
        if version != api.SNMP_VERSION_2C:
            return None
        p = api.PROTOCOL_MODULES[version]
        req, _ = decoder.decode(data, asn1Spec=p.Message())
        community = bytes(p.apiMessage.get_community(req))
        return (p, req, community) if community == self.community.encode() else None

    def _answer(self, data: bytes) -> bytes | None:
        """The answer's bytes to one request datagram (None: no answer). A read (GET, GETNEXT, GETBULK) is put
        together from the table's encoded varbinds; a SET goes the pysnmp way."""
        got = self._request(data)
        if got is None:
            return None
        p, req, community = got
        req_pdu = p.apiMessage.get_pdu(req)
        if req_pdu.isSameTypeWith(p.SetRequestPDU()):
            return self._pysnmp_answer(p, req)
        self.requests += 1
        table = self._current()
        pairs = self._read_pairs(p, req_pdu, table)
        if pairs is None:
            return None
        request_id = encoder.encode(univ.Integer(int(p.apiPDU.get_request_id(req_pdu))))
        varbinds = b"".join(_served(table, oid, value) for oid, value in pairs)
        return _tlv(0x30, V2C + _tlv(0x04, community) + _tlv(0xA2, request_id + NO_ERROR + _tlv(0x30, varbinds)))

    def _current(self) -> OidTable:
        """The table to answer from: built now if the device left a builder at its last tick (`pending`)."""
        build, self.pending = self.pending, None
        if build is not None:
            self.table = build()
        return self.table

    @staticmethod
    def _read_pairs(p: Any, req_pdu: Any, table: Any) -> list[tuple[Oid, Any]] | None:
        """(oid, value) of each varbind that answers a read PDU (GET, GETNEXT, GETBULK) from `table`; None for
        any other PDU."""
        names = [tuple(name) for name, _ in p.apiPDU.get_varbinds(req_pdu)]
        out: list[tuple[Oid, Any]] = []
        if req_pdu.isSameTypeWith(p.GetRequestPDU()):
            for n in names:
                v = table.get(n)
                out.append((n, v if v is not None else rfc1905.noSuchInstance))
        elif req_pdu.isSameTypeWith(p.GetNextRequestPDU()):
            for n in names:
                out.append(table.next(n) or (n, rfc1905.endOfMibView))
        elif req_pdu.isSameTypeWith(p.GetBulkRequestPDU()):
            non_rep = int(p.apiBulkPDU.get_non_repeaters(req_pdu))
            max_rep = max(1, min(int(p.apiBulkPDU.get_max_repetitions(req_pdu)), 64))
            for n in names[:non_rep]:
                out.append(table.next(n) or (n, rfc1905.endOfMibView))
            cursors: list[Oid | None] = list(names[non_rep:])
            for _ in range(max_rep):
                if not cursors:
                    break
                for i, cur in enumerate(cursors):
                    nxt = table.next(cur) if cur is not None else None
                    if nxt is None:
                        out.append((cur or (0, 0), rfc1905.endOfMibView))
                        cursors[i] = None
                    else:
                        out.append(nxt)
                        cursors[i] = nxt[0]
                if all(c is None for c in cursors):
                    break
        else:
            return None
        return out

    def _answer_with_pysnmp(self, data: bytes) -> bytes | None:
        """The same answer built with pysnmp's message API: the reference the reads' own assembly is tested
        against."""
        got = self._request(data)
        return self._pysnmp_answer(*got[:2]) if got is not None else None

    def _pysnmp_answer(self, p: Any, req: Any) -> bytes | None:
        """The answer to a decoded request built with pysnmp's message API (a SET's callbacks included)."""
        self.requests += 1
        rsp = p.apiMessage.get_response(req)
        req_pdu = p.apiMessage.get_pdu(req)
        rsp_pdu = p.apiMessage.get_pdu(rsp)
        table = self._current()
        out: list[tuple[Any, Any]] | None
        if req_pdu.isSameTypeWith(p.SetRequestPDU()):
            var_binds = p.apiPDU.get_varbinds(req_pdu)
            out = []
            for i, (name, value) in enumerate(var_binds):
                try:
                    if self.on_set is None:
                        raise SetRefused(17)
                    out.append((name, self.on_set(tuple(name), value)))
                except SetRefused as exc:
                    p.apiPDU.set_error_status(rsp_pdu, exc.status)
                    p.apiPDU.set_error_index(rsp_pdu, i + 1)
                    out = list(var_binds)
                    break
        else:
            out = self._read_pairs(p, req_pdu, table)
            if out is None:
                return None
        p.apiPDU.set_varbinds(rsp_pdu, out)
        return encoder.encode(rsp)


def gauge(v: float) -> rfc1902.Gauge32:
    """A Gauge32/Unsigned32 value, clamped and wrapped as the MIB says (mod 2^32)."""
    return rfc1902.Gauge32(int(v) % (1 << 32))


def integer(v: int) -> rfc1902.Integer32:
    return rfc1902.Integer32(int(v))


def text(v: str) -> rfc1902.OctetString:
    return rfc1902.OctetString(v)


class SnmpSimDevice:
    """What every simulated SNMP device shares: its agent bound on 127.0.0.1 (port 0: a free one), a first table
    from the model at start, and going silent while offline. Subclasses set `agent` and implement `update`."""

    agent: SnmpAgent
    model: Any

    def __init__(self, port: int = 0):
        self._port = port
        self._endpoint: tuple[str, int] = ("127.0.0.1", port)

    @property
    def endpoint(self) -> tuple[str, int]:
        return self._endpoint

    async def start(self) -> None:
        self._endpoint = await self.agent.start("127.0.0.1", self._port)
        with self.model.lock:
            self.update(self.model)

    async def stop(self) -> None:
        self.agent.stop()

    def update(self, model: Any) -> None:
        raise NotImplementedError

    def set_offline(self, on: bool) -> None:
        """The device stops answering SNMP (network or management card down) while `on`."""
        self.agent.offline = on


V2C = b"\x02\x01\x01"  # version: INTEGER 1 (v2c)
NO_ERROR = b"\x02\x01\x00\x02\x01\x00"  # error-status 0, error-index 0


def _tlv(tag: int, body: bytes) -> bytes:
    """One BER element: tag, definite length (short form below 128 bytes), body. The agent's SNMP codec
    (exporters/snmp/v2c.py) has its own: this simulator is that codec's test peer and shares none of its code,
    so a mistake in one cannot hide in both."""
    n = len(body)
    if n < 0x80:
        return bytes((tag, n)) + body
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(size))) + size + body


def _served(table: Any, oid: Oid, value: Any) -> bytes:
    """The varbind's BER bytes, from the table's cache when the value is the table's own (a table without a cache,
    or a value it does not hold, e.g. a test's bent table: encoded afresh)."""
    cache = getattr(table, "encoded", None)
    if cache is None or table.values.get(oid) is not value:
        return _varbind(oid, value)
    got = cache.get(oid)
    if got is None:
        got = cache[oid] = _varbind(oid, value)
    return got


def _varbind(oid: Oid, value: Any) -> bytes:
    return _tlv(0x30, encoder.encode(univ.ObjectIdentifier(oid)) + encoder.encode(value))
