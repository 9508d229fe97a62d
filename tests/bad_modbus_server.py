"""A misbehaving Modbus TCP server on 127.0.0.1: honest registers, hostile framing (issue 18 test peer).

It speaks raw MBAP by hand (not pymodbus's server), so it can send what a
well-behaved stack never would. Every register reads `registers` (default
0: a dry leak controller); `lie` holds the values the hostile frames carry
(default: register 0 = 1, a leak on zone 1).

Modes:
  good       honest answers
  tid0       a frame with transaction id 0 carrying the lie, then the honest answer
  wrong_fc   the lie under another function code (fc 3 <-> fc 4) instead of the answer
  wrong_tid  a frame for another transaction id carrying the lie, then the honest answer
  wrong_unit the lie from another unit id instead of the answer
  short      the answer with a byte count that says one register fewer than asked
  garbage    bytes that are not a Modbus frame
  slow       honest answers `delay` seconds late
  hangup     the connection closed instead of an answer
  hangup_once  the first request's connection closed instead of an answer, then honest answers

Writes of a coil or a register (fc 5, 6) are honest in every mode but the hang-ups: the written value is kept
(`written`, address -> value, and read back) and the request echoed, as a device does.
"""

from __future__ import annotations

import asyncio
import struct

MODES = ("good", "tid0", "wrong_fc", "wrong_tid", "wrong_unit", "short", "garbage", "slow", "hangup", "hangup_once")


class BadModbusServer:
    def __init__(self, mode: str, registers: dict[int, int] | None = None, lie: dict[int, int] | None = None,
                 delay: float = 2.0):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
        self.mode, self.delay = mode, delay
        self.registers = dict(registers or {})
        self.lie = dict(lie if lie is not None else {0: 1})
        self.requests = 0
        self.written: dict[int, int] = {}
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    @staticmethod
    def frame(tid: int, unit: int, fc: int, values: list[int]) -> bytes:
        """A read reply: registers (fc 3/4) as words, bits (fc 1/2) packed LSB first."""
        if fc in (1, 2):
            data = bytearray((len(values) + 7) // 8)
            for i, v in enumerate(values):
                data[i // 8] |= (1 if v else 0) << (i % 8)
        else:
            data = bytearray(b"".join(int(v).to_bytes(2, "big") for v in values))
        pdu = bytes((fc, len(data))) + bytes(data)
        return struct.pack(">HHHB", tid, 0, len(pdu) + 1, unit) + pdu

    def _values(self, table: dict[int, int], address: int, count: int) -> list[int]:
        return [table.get(a, self.written.get(a, self.registers.get(a, 0))) for a in range(address, address + count)]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                tid, _, length, unit = struct.unpack(">HHHB", await reader.readexactly(7))
                body = await reader.readexactly(length - 1)
                fc, (address, count) = body[0], struct.unpack(">HH", body[1:5])
                self.requests += 1
                if self.mode == "hangup":
                    break
                if self.mode == "hangup_once":
                    self.mode = "good"
                    break
                if fc in (5, 6):  # count is the value written; the reply echoes the request
                    self.written[address] = int(count == 0xFF00) if fc == 5 else count
                    writer.write(struct.pack(">HHHB", tid, 0, length, unit) + body)
                    await writer.drain()
                    continue
                writer.write(await self._reply(tid, unit, fc, address, count))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _reply(self, tid: int, unit: int, fc: int, address: int, count: int) -> bytes:
        honest = self.frame(tid, unit, fc, self._values({}, address, count))
        lie = self._values(self.lie, address, count)
        if self.mode == "tid0":
            return self.frame(0, unit, fc, lie) + honest
        if self.mode == "wrong_fc":
            return self.frame(tid, unit, {3: 4, 4: 3}.get(fc, 3), lie)
        if self.mode == "wrong_tid":
            return self.frame((tid + 1) & 0xFFFF, unit, fc, lie) + honest
        if self.mode == "wrong_unit":
            return self.frame(tid, (unit + 1) & 0xFF, fc, lie)
        if self.mode == "short" and fc in (3, 4) and count > 1:
            return self.frame(tid, unit, fc, lie[:count - 1])
        if self.mode == "garbage":
            return b"\xde\xad\xbe\xef" * 8
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
        return honest
