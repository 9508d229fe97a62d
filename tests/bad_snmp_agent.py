"""A misbehaving SNMP v2c agent (UDP on 127.0.0.1): the simulated Raritan PDU, answering as a hostile device would.

A test peer for issue 18 (device input is untrusted). It serves the
simulator's PDU2-MIB table (sim.snmp_pdu) and bends its answers as
`mode` says. Requests are read with pyasn1 and answers are encoded here by
hand (not with the agent's own codec), so it can send what pyasn1 refuses
to: a Gauge32 over 32 bits, an INTEGER of 1,100 bits, an OID
sub-identifier of 4,300 digits.

Modes:
  huge_subid        one outlet row's OID carries a 4,300-digit sub-identifier
  endless_column    the outlet value column never ends (rows 1, 2, 3, ... forever)
  not_increasing    the outlet value column jumps back to its first row after outlet 3
  oversize_integers outlet 1's power is a Gauge32 of 2^32 + 5, outlet 2's an INTEGER of 1,100 bits
  bad_digits        outlet 1's power DecimalDigits is 400, outlet 2's is -400
  spoofed           each answer is preceded by a 60 KB datagram with another request-id and a huge OID
  garbage_varbinds  the right request-id, then a varbind list that is not BER
  garbage           bytes that are not SNMP at all
  slow              every answer comes `delay` seconds late
"""

from __future__ import annotations

import asyncio
from typing import Any

from pyasn1.codec.ber import decoder, encoder
from pysnmp.proto import api

from sim.snmp_agent import Oid, OidTable, SnmpAgent, gauge
from sim.snmp_pdu import OUTLET_DIGITS, OUTLET_VALUE, POWER
# The agent's own BER primitives, without encode_oid's bounds: this peer must be able to break them.
from exporters.snmp.v2c import _subid, _tlv

P = api.PROTOCOL_MODULES[api.SNMP_VERSION_2C]
MODES = ("huge_subid", "endless_column", "not_increasing", "oversize_integers", "bad_digits", "spoofed",
         "garbage_varbinds", "garbage", "slow")
HUGE_SUBID = b"\x81" * 2040 + b"\x01"  # base-128: about 14,280 bits, a 4,300-digit number
_N = len(OUTLET_VALUE)


def oid_tlv(oid: Oid, tail: bytes = b"") -> bytes:
    """An OID TLV; `tail` appends raw sub-identifier bytes (a huge one) after `oid`."""
    return _tlv(0x06, _subid(oid[0] * 40 + oid[1]) + b"".join(_subid(s) for s in oid[2:]) + tail)


def int_tlv(tag: int, value: int, width: int | None = None) -> bytes:
    width = width or value.bit_length() // 8 + 1
    return _tlv(tag, value.to_bytes(width, "big", signed=value < 0))


def response(request_id: int, varbinds: list[bytes], status: int = 0, index: int = 0) -> bytes:
    """A v2c Response message from encoded varbinds (each one SEQUENCE TLV)."""
    pdu = int_tlv(0x02, request_id) + int_tlv(0x02, status) + int_tlv(0x02, index) + _tlv(0x30, b"".join(varbinds))
    return _tlv(0x30, int_tlv(0x02, 1) + _tlv(0x04, b"public") + _tlv(0xA2, pdu))


class _BentTable:
    """The PDU's table, with the outlet value column bent as the mode says (walk modes)."""

    def __init__(self, inner: OidTable, mode: str):
        self.inner, self.mode = inner, mode
        self.keys, self.values = inner.keys, inner.values

    def get(self, oid: Oid) -> Any:
        return self.inner.get(oid)

    def next(self, oid: Oid) -> tuple[Oid, Any] | None:
        if oid[:_N] == OUTLET_VALUE:
            idx = oid[_N:]
            if self.mode == "endless_column":
                return OUTLET_VALUE + (1, idx[1] + 1 if len(idx) >= 2 else 1, POWER), gauge(100)
            if self.mode == "not_increasing" and len(idx) >= 2 and idx[1] >= 3:
                return self.inner.next(OUTLET_VALUE)  # back to the column's first row
        return self.inner.next(oid)


class BadSnmpAgent(SnmpAgent):
    """The simulator's agent, misbehaving as `mode` says; counts the requests it answered."""

    def __init__(self, mode: str, community: str = "public", delay: float = 2.0):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
        self.mode, self.delay = mode, delay
        self._table: Any = OidTable()
        self.spoofed = 0  # spoofed datagrams sent
        self.last_request_id = 0
        super().__init__(community)

    @property
    def table(self) -> Any:
        return self._table

    @table.setter
    def table(self, value: OidTable) -> None:  # the simulated PDU swaps in a fresh table every tick
        self._table = _BentTable(value, self.mode) if self.mode in ("endless_column", "not_increasing") else value

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.mode == "slow":
            asyncio.get_running_loop().call_later(self.delay, super().datagram_received, data, addr)
            return
        try:
            rsp = self._answer(data)
        except Exception:  # a malformed request is dropped, like a real agent would
            return
        if rsp is None or self._transport is None:
            return
        if self.mode == "spoofed":
            self._transport.sendto(self._spoof(), addr)
            self.spoofed += 1
        self._transport.sendto(rsp, addr)

    def _spoof(self) -> bytes:
        """A 60 KB datagram for another request-id whose OID has one 60,000-byte sub-identifier."""
        huge = _tlv(0x30, oid_tlv((1, 3, 6, 1), b"\x81" * 60_000 + b"\x01") + b"\x05\x00")
        return response((self.last_request_id + 7919) % (1 << 31), [huge])

    def _answer(self, data: bytes) -> bytes | None:
        good = super()._answer(data)
        if good is None or self.mode in ("endless_column", "not_increasing", "slow"):
            return good
        rsp, _ = decoder.decode(good, asn1Spec=P.Message())
        pdu = P.apiMessage.get_pdu(rsp)
        request_id = int(P.apiPDU.get_request_id(pdu))
        if self.mode == "garbage":
            return b"\x00\xff not SNMP at all \x30\x84\xff\xff\xff\xff" * 8
        if self.mode == "garbage_varbinds":
            return response(request_id, [b"\x30\x06\x06\x02\xff\xff\x05\x00"])  # an OID that never ends
        self.last_request_id = request_id
        varbinds = [self._bend(tuple(name), encoder.encode(value)) for name, value in P.apiPDU.get_varbinds(pdu)]
        return response(request_id, varbinds)

    def _bend(self, oid: Oid, value: bytes) -> bytes:
        """One varbind TLV, bent as the mode says for the rows it targets."""
        outlet_power = {OUTLET_VALUE + (1, o, POWER): o for o in (1, 2)}
        outlet_digits = {OUTLET_DIGITS + (1, o, POWER): o for o in (1, 2)}
        if self.mode == "huge_subid" and oid == OUTLET_VALUE + (1, 1, POWER):
            return _tlv(0x30, oid_tlv(oid[:-1], HUGE_SUBID) + value)
        if self.mode == "oversize_integers" and oid in outlet_power:
            value = int_tlv(0x42, (1 << 32) + 5) if outlet_power[oid] == 1 else int_tlv(0x02, 1 << 1100)
        if self.mode == "bad_digits" and oid in outlet_digits:
            value = int_tlv(0x42, 400) if outlet_digits[oid] == 1 else int_tlv(0x02, -400)
        return _tlv(0x30, oid_tlv(oid) + value)
