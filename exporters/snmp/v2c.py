"""SNMP v2c over one asyncio UDP socket per device: a small BER codec for the few PDUs the agent sends.

Why not pysnmp's engine for v2c: its high-level API costs ~4 ms CPU per
request and pyasn1 ~60 us per decoded varbind, which made a PDU poll twice
as slow as prometheus-snmp-exporter. v2c needs no security processing, so
GET / GETBULK / SET messages are encoded and their responses decoded here
(SNMPv2-PDU, RFC 3416; BER, X.690), matched by request-id, with a timeout
and retries per request. v3 (USM) stays on pysnmp's engine (snmp_client).

Values come back as Python values the way `snmp_v3.to_python` turns
pysnmp objects into them: numbers as int, strings as str (utf-8, else
hex), OIDs as dotted str, and `END` for noSuchObject / noSuchInstance /
endOfMibView.

Device input is untrusted (issue 18): a datagram's request-id is read
before anything else, so a spoofed or late datagram costs a few header
bytes and never a varbind decode; OIDs decode in linear time with
sub-identifiers capped at 32 bits and 128 of them (RFC 2578); a number
wider than its SMI type (Integer32, Counter32/Gauge32/TimeTicks: 32 bits,
Counter64: 64) comes back as a `BadValue`, which the decoder turns into a
per-reading sensor fault, so one bad varbind never fails the whole PDU.
"""

from __future__ import annotations

import asyncio
import random
import socket
from typing import Any

from exporters.model import SourceError

GET, GETNEXT, RESPONSE, SET, GETBULK = 0xA0, 0xA1, 0xA2, 0xA3, 0xA5
_INTEGER, _OCTETS, _NULL, _OID, _SEQ = 0x02, 0x04, 0x05, 0x06, 0x30
_UNSIGNED = (0x41, 0x42, 0x43, 0x46)  # Counter32, Gauge32/Unsigned32, TimeTicks, Counter64
_BYTES = (_OCTETS, 0x40, _NULL)  # OctetString, IpAddress, Null: as pysnmp's OctetString family
_OPAQUE = 0x44  # str() of pysnmp's Opaque: latin-1
_EXCEPTIONS = (0x80, 0x81, 0x82)  # noSuchObject, noSuchInstance, endOfMibView
_UNSIGNED_BITS = {0x41: 32, 0x42: 32, 0x43: 32, 0x46: 64}
_UNSIGNED32 = frozenset(t for t, bits in _UNSIGNED_BITS.items() if bits == 32)
MAX_SUBID = (1 << 32) - 1  # RFC 2578 3.5: sub-identifiers are 0..2^32-1
MAX_OID_LENGTH = 128  # RFC 2578 3.5: at most 128 sub-identifiers
ERROR_NAMES = ("noError", "tooBig", "noSuchName", "badValue", "readOnly", "genErr", "noAccess", "wrongType",
               "wrongLength", "wrongEncoding", "wrongValue", "noCreation", "inconsistentValue",
               "resourceUnavailable", "commitFailed", "undoFailed", "authorizationError", "notWritable",
               "inconsistentName")
TOO_BIG = 1

Oid = tuple[int, ...]


class _End:
    """noSuchObject / noSuchInstance / endOfMibView: the walk stops on it; the value reads as None."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "END"


END = _End()


class BadValue:
    """A varbind value outside its SMI type's range (or empty): read as a sensor fault for that reading only."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason

    def __repr__(self) -> str:
        return f"BadValue({self.reason!r})"

    def __str__(self) -> str:
        return f"<bad value: {self.reason}>"


def error_name(status: int) -> str:
    return ERROR_NAMES[status] if 0 <= status < len(ERROR_NAMES) else f"error {status}"


# -- encoding -------------------------------------------------------------------------


def _tlv(tag: int, body: bytes) -> bytes:
    n = len(body)
    if n < 0x80:
        return bytes((tag, n)) + body
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(size))) + size + body


def _int(tag: int, v: int) -> bytes:
    return _tlv(tag, v.to_bytes(v.bit_length() // 8 + 1, "big", signed=True))


def _subid(v: int) -> bytes:
    out = [v & 0x7F]
    v >>= 7
    while v:
        out.append(0x80 | (v & 0x7F))
        v >>= 7
    return bytes(reversed(out))


_ENCODED: dict[Oid, bytes] = {}  # a walk asks from the same cursors every poll: encoded once (bounded)


def encode_oid(oid: Oid) -> bytes:
    done = _ENCODED.get(oid)
    if done is not None:
        return done
    if len(oid) < 2 or oid[0] > 2 or (oid[0] < 2 and oid[1] >= 40) or min(oid) < 0:
        raise SourceError("config", f"invalid OID {'.'.join(map(str, oid))!r}")
    done = _tlv(_OID, _subid(oid[0] * 40 + oid[1]) + b"".join(_subid(s) for s in oid[2:]))
    if len(_ENCODED) >= 4096:
        _ENCODED.clear()
    _ENCODED[oid] = done
    return done


def encode_request(pdu: int, request_id: int, community: bytes, varbinds: list[tuple[Oid, bytes]],
                   a: int = 0, b: int = 0) -> bytes:
    """A v2c message; `a`/`b` are error-status/index (0) or, for GETBULK, non-repeaters/max-repetitions.

    Each varbind value is an encoded TLV (`NULL` for reads, `integer(v)` for SET).
    """
    vbs = b"".join(_tlv(_SEQ, encode_oid(o) + v) for o, v in varbinds)
    body = _int(_INTEGER, request_id) + _int(_INTEGER, a) + _int(_INTEGER, b) + _tlv(_SEQ, vbs)
    return _tlv(_SEQ, _int(_INTEGER, 1) + _tlv(_OCTETS, community) + _tlv(pdu, body))


NULL = b"\x05\x00"


def integer(v: int) -> bytes:
    """An Integer32 varbind value for SET."""
    return _int(_INTEGER, v)


# -- decoding -------------------------------------------------------------------------


class BerError(ValueError):
    pass


def _head(data: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the TLV at `pos`."""
    if pos + 2 > end:
        raise BerError("truncated")
    tag, n = data[pos], data[pos + 1]
    pos += 2
    if n & 0x80:
        k = n & 0x7F
        if not 0 < k <= 4 or pos + k > end:
            raise BerError("bad length")
        n = int.from_bytes(data[pos:pos + k], "big")
        pos += k
    if pos + n > end:
        raise BerError("truncated")
    return tag, pos, pos + n


def _expect(data: bytes, pos: int, end: int, tag: int) -> tuple[int, int]:
    t, s, e = _head(data, pos, end)
    if t != tag:
        raise BerError(f"expected tag 0x{tag:02x}, got 0x{t:02x}")
    return s, e


def _signed(data: bytes, s: int, e: int) -> int:
    """A header INTEGER (request-id, status, index: Integer32); wider ones are refused before any big-int work."""
    if s == e:
        raise BerError("empty integer")
    if e - s > 5:
        raise BerError(f"integer of {e - s} bytes where Integer32 is expected")
    return int.from_bytes(data[s:e], "big", signed=True)


def decode_oid(data: bytes, s: int, e: int) -> Oid:
    """An OID's sub-identifiers; linear in its length, each capped at 32 bits (a 4,300-digit one is refused)."""
    if s == e:
        raise BerError("empty OID")
    if data[e - 1] & 0x80:
        raise BerError("unterminated OID")
    out: list[int] = []
    v = 0
    limit = MAX_SUBID + 80  # the first sub-identifier carries 40 * first arc + second arc
    for byte in data[s:e]:
        v = (v << 7) | (byte & 0x7F)
        if v > limit:  # checked per byte: the value never grows past 39 bits, so each step is O(1)
            raise BerError("OID sub-identifier over 32 bits")
        if not byte & 0x80:
            if len(out) + 2 > MAX_OID_LENGTH:  # the first sub-identifier holds two arcs
                raise BerError(f"OID longer than {MAX_OID_LENGTH} sub-identifiers")
            out.append(v)
            v, limit = 0, MAX_SUBID
    first = out[0]
    head = (first // 40, first % 40) if first < 80 else (2, first - 80)
    return head + tuple(out[1:])


def _number(data: bytes, tag: int, s: int, e: int) -> int | BadValue:
    """An INTEGER (Integer32) or unsigned (Counter32, Gauge32, TimeTicks, Counter64) value within its type's range.

    Encoders pad (pyasn1 sends -2^31 in 5 bytes), so the width is judged on
    the value; a body longer than 9 bytes cannot hold any of these types and
    is refused before it is turned into a number.
    """
    if s == e:
        return BadValue("empty integer")
    if e - s > 9:
        return BadValue(f"tag 0x{tag:02x}: a {e - s}-byte number")
    bits = _UNSIGNED_BITS.get(tag)
    if bits is None:  # Integer32
        v = int.from_bytes(data[s:e], "big", signed=True)
        if not -(1 << 31) <= v < (1 << 31):
            return BadValue(f"INTEGER {v} is outside Integer32")
        return v
    v = int.from_bytes(data[s:e], "big")
    if v >> bits:
        return BadValue(f"tag 0x{tag:02x}: {v} is over {bits} bits")
    return v


def _value(data: bytes, tag: int, s: int, e: int) -> Any:
    if tag in _UNSIGNED or tag == _INTEGER:
        return _number(data, tag, s, e)
    if tag in _BYTES:
        raw = data[s:e]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.hex()
    if tag in _EXCEPTIONS:
        return END
    if tag == _OPAQUE:
        return data[s:e].decode("latin-1")
    if tag == _OID:
        try:
            return ".".join(map(str, decode_oid(data, s, e)))
        except BerError as exc:
            return BadValue(f"OID value: {exc}")
    return BadValue(f"unknown value tag 0x{tag:02x}")  # framed correctly: only this varbind is unreadable


def decode_header(data: bytes) -> tuple[int, int, int, int, int]:
    """(request-id, error-status, error-index, start, end of the varbind list) of a v2c Response.

    Cheap on purpose: it reads a few header bytes, so a datagram that is
    not for a pending request is dropped before its varbinds are touched.
    """
    end = len(data)
    s, end = _expect(data, 0, end, _SEQ)
    s, e = _expect(data, s, end, _INTEGER)
    if _signed(data, s, e) != 1:
        raise BerError("not an SNMPv2c message")
    _, pos = _expect(data, e, end, _OCTETS)
    s, end = _expect(data, pos, end, RESPONSE)
    fields = []
    pos = s
    for _ in range(3):
        s, pos = _expect(data, pos, end, _INTEGER)
        fields.append(_signed(data, s, pos))
    pos, end = _expect(data, pos, end, _SEQ)
    return fields[0], fields[1], fields[2], pos, end


# Encoded OID -> decoded: a walk reads the same few hundred OIDs every poll, and decoding them was a third
# of a PDU poll. Bounded in entries and key length, so odd or hostile answers cannot grow it.
_OID_CACHE: dict[bytes, Oid] = {}
_OID_CACHE_ENTRIES = 8192
_OID_CACHE_KEY_BYTES = 64


def decode_varbinds(data: bytes, pos: int, end: int) -> list[tuple[Oid, Any]]:
    """The varbinds between `pos` and `end` (from `decode_header`); BerError when the list is malformed."""
    varbinds: list[tuple[Oid, Any]] = []
    cache = _OID_CACHE
    while pos < end:
        # The short length form everywhere (a varbind under 128 bytes: nearly all of them) is read inline,
        # with the same bounds as _head; anything else goes the general way.
        if (pos + 4 <= end and data[pos] == _SEQ and data[pos + 1] < 0x80 and data[pos + 2] == _OID
                and data[pos + 3] < 0x80):
            vb_end = pos + 2 + data[pos + 1]
            os_ = pos + 4
            oe = os_ + data[pos + 3]
            if vb_end > end or oe > vb_end:
                raise BerError("truncated")
            if oe + 2 > vb_end:
                raise BerError("truncated")
            tag, n = data[oe], data[oe + 1]
            if n < 0x80:
                vs, ve = oe + 2, oe + 2 + n
                if ve > vb_end:
                    raise BerError("truncated")
            else:
                tag, vs, ve = _head(data, oe, vb_end)
            pos = vb_end
        else:
            s, pos = _expect(data, pos, end, _SEQ)
            os_, oe = _expect(data, s, pos, _OID)
            tag, vs, ve = _head(data, oe, pos)
        raw = data[os_:oe]
        oid = cache.get(raw)
        if oid is None:
            oid = decode_oid(data, os_, oe)  # raises on a malformed one: only good OIDs are kept
            if len(raw) <= _OID_CACHE_KEY_BYTES:
                if len(cache) >= _OID_CACHE_ENTRIES:
                    cache.clear()
                cache[raw] = oid
        if 0 < ve - vs <= 4 and (tag == _INTEGER or tag in _UNSIGNED32):
            # at most 4 content bytes: within Integer32 (signed) or the 32-bit unsigned types, no range check left
            varbinds.append((oid, int.from_bytes(data[vs:ve], "big", signed=tag == _INTEGER)))
        else:
            varbinds.append((oid, _value(data, tag, vs, ve)))
    return varbinds


def decode_response(data: bytes) -> tuple[int, int, int, list[tuple[Oid, Any]]]:
    """(request-id, error-status, error-index, varbinds) of a v2c Response; BerError if it is not one."""
    request_id, status, index, pos, end = decode_header(data)
    return request_id, status, index, decode_varbinds(data, pos, end)


# -- transport ------------------------------------------------------------------------


class V2cTransport(asyncio.DatagramProtocol):
    """One connected UDP socket to one agent; concurrent requests are told apart by request-id.

    Opened lazily on the running loop, and again on the next loop after that
    one finished (a caller doing `asyncio.run` per call); one loop at a time.
    """

    def __init__(self, host: str, port: int, community: str, timeout: float, retries: int):
        self.where = f"{host}:{port}"
        self._addr = (host, port)
        self._community = community.encode()
        self._timeout, self._retries = timeout, retries
        self._transport: asyncio.DatagramTransport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sock: socket.socket | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._next_id = random.randrange(1, 1 << 30)

    async def _open(self) -> asyncio.DatagramTransport:
        loop = asyncio.get_running_loop()
        if self._transport is not None and self._loop is loop and not self._transport.is_closing():
            return self._transport
        self.close()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            infos = await loop.getaddrinfo(*self._addr, family=socket.AF_INET, type=socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.connect(infos[0][4])  # connected: the kernel drops datagrams from anyone but the agent
            transport, _ = await loop.create_datagram_endpoint(lambda: self, sock=sock)
        except OSError as exc:
            sock.close()
            raise SourceError("config", f"{self.where}: cannot open a UDP socket to the agent ({exc})") from None
        except BaseException:
            sock.close()
            raise
        self._transport, self._loop, self._sock = transport, loop, sock
        return transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        try:
            request_id, status, index, pos, end = decode_header(data)
        except BerError:
            return  # not a response we can read: dropped, the request times out or a retry gets a good one
        fut = self._pending.get(request_id)
        if fut is None or fut.done():
            return  # spoofed, late or duplicate: dropped before its varbinds cost anything
        try:
            varbinds = decode_varbinds(data, pos, end)
        except BerError as exc:
            fut.set_exception(SourceError("decode", f"{self.where}: malformed SNMP response ({exc})"))
            return
        fut.set_result((status, index, varbinds))

    def error_received(self, exc: Exception) -> None:
        pass  # ICMP unreachable and the like: the request times out, as with pysnmp

    async def request(self, pdu: int, varbinds: list[tuple[Oid, bytes]], a: int = 0,
                      b: int = 0) -> tuple[int, int, list[tuple[Oid, Any]]]:
        """Send one request (retransmitted `retries` times, same request-id) and return its response."""
        transport = await self._open()
        request_id = self._next_id
        self._next_id = self._next_id % ((1 << 31) - 1) + 1
        message = encode_request(pdu, request_id, self._community, varbinds, a, b)
        try:
            for _ in range(self._retries + 1):
                # a future per try, under the same request-id: a late answer to the first try still ends the second
                fut = self._pending[request_id] = self._loop.create_future()
                transport.sendto(message)
                try:
                    async with asyncio.timeout(self._timeout):  # no wait_for/shield: no extra future per request
                        return await fut
                except TimeoutError:
                    continue
        finally:
            self._pending.pop(request_id, None)
        raise SourceError("timeout", f"{self.where}: no SNMP response before timeout "
                                     f"({self._timeout:g} s, {self._retries + 1} tries)")

    def close(self) -> None:
        transport, loop, sock = self._transport, self._loop, self._sock
        self._transport = self._loop = self._sock = None
        if transport is None:
            return
        if loop is not None and loop.is_closed():  # left behind by a finished asyncio.run: close the socket itself
            sock.close()
        else:
            transport.close()
