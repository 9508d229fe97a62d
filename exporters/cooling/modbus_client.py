"""One Modbus TCP connection and one lock per gateway, with retries that know Modbus.

Many gateways accept very few connections, and an RTU line behind a TCP
gateway can carry one request at a time, so every source talking to the same
host:port shares one client and one lock (as Home Assistant's Modbus hub
does). Exception 6 (device busy) and 11 (gateway target failed to respond)
are worth a retry after a short backoff; other exceptions are final. A
dropped or timed-out connection is closed and reopened on the next request,
so a late answer can never be taken for the reply to a newer request.

Answers are untrusted (issue 18): pymodbus takes a frame with transaction id
0 as the answer to any request, and decodes a frame of another function code
as what it claims to be. A reply whose transaction id is 0 or whose function
code is not the one asked is refused (SourceError "protocol") and the
connection is dropped, so a stray frame can never read as `leak_detected=1`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pymodbus.client import AsyncModbusTcpClient
from pymodbus.exceptions import ConnectionException, ModbusException, ModbusIOException

from exporters.model import SourceError

log = logging.getLogger(__name__)

RETRY_CODES = frozenset({6, 11})
EXCEPTION_NAMES = {1: "illegal function", 2: "illegal data address", 3: "illegal data value",
                   4: "device failure", 5: "acknowledge", 6: "device busy", 8: "memory parity error",
                   10: "gateway path unavailable", 11: "gateway target failed to respond"}


class ModbusExceptionReply(Exception):
    """The device answered with a Modbus exception code (the device is up)."""

    def __init__(self, code: int, what: str):
        super().__init__(f"{what}: Modbus exception {code} ({EXCEPTION_NAMES.get(code, 'unknown')})")
        self.code = code


@dataclass
class GatewayStats:
    requests: int = 0
    exceptions: Counter = field(default_factory=Counter)  # code -> count
    reconnects: int = 0


class Gateway:
    """A shared client for one host:port; all requests go through `lock`."""

    def __init__(self, host: str, port: int, timeout: float):
        self.host, self.port, self.timeout = host, port, timeout
        self.lock = asyncio.Lock()
        self.stats = GatewayStats()
        self._client: AsyncModbusTcpClient | None = None
        self._lost = asyncio.Event()  # set when the peer closes the connection under us
        self._last_request = 0.0
        self.users = 0

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    async def _connected(self) -> AsyncModbusTcpClient:
        if self._client is not None and self._client.connected:
            return self._client
        if self._client is not None:
            self._client.close()
            self.stats.reconnects += 1
        # reconnect_delay=0: we reconnect ourselves, on the next request, never in the background.
        lost = self._lost = asyncio.Event()
        self._client = AsyncModbusTcpClient(self.host, port=self.port, timeout=self.timeout, retries=0,
                                            reconnect_delay=0, name=f"modbus-{self.target}",
                                            trace_connect=lambda up: None if up else lost.set())
        try:
            ok = await asyncio.wait_for(self._client.connect(), self.timeout)
        except asyncio.TimeoutError:
            ok = False
        if not ok:
            self._drop()
            raise SourceError("connection", f"{self.target}: cannot connect")
        return self._client

    def _drop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def read(self, fc: int, address: int, count: int, unit: int, gap_s: float = 0.0,
                   busy_retries: int = 3, backoff_s: float = 0.05, stats: GatewayStats | None = None) -> list[int]:
        """Read `count` registers or bits; retries busy/gateway errors and one dropped connection."""
        what = f"{self.target} unit {unit} fc{fc} @{address}+{count}"
        attempt_busy = attempt_conn = 0
        while True:
            try:
                async with self.lock:
                    return await self._read_once(fc, address, count, unit, gap_s, what, stats or self.stats)
            except ModbusExceptionReply as exc:
                if exc.code in RETRY_CODES and attempt_busy < busy_retries:
                    await asyncio.sleep(backoff_s * (2 ** attempt_busy))
                    attempt_busy += 1
                    continue
                raise
            except SourceError as exc:
                if exc.kind == "connection" and attempt_conn < 1 and "dropped" in str(exc):
                    attempt_conn += 1  # the connection died under us: reconnect once, then give up
                    continue
                raise

    async def _read_once(self, fc: int, address: int, count: int, unit: int, gap_s: float, what: str,
                         stats: GatewayStats) -> list[int]:
        wait = self._last_request + gap_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        client = await self._connected()
        call = {1: client.read_coils, 2: client.read_discrete_inputs,
                3: client.read_holding_registers, 4: client.read_input_registers}[fc]
        stats.requests += 1
        try:
            rr = await self._unless_lost(call(address, count=count, device_id=unit), what)
        except (asyncio.TimeoutError, ModbusIOException) as exc:
            self._drop()
            if isinstance(exc, ModbusIOException) and not self._is_timeout(exc):
                raise SourceError("connection", f"{what}: connection dropped ({exc})") from None
            raise SourceError("timeout", f"{what}: no answer within {self.timeout:.2f}s") from None
        except ConnectionException as exc:
            self._drop()
            raise SourceError("connection", f"{what}: connection dropped ({exc})") from None
        except ModbusException as exc:
            self._drop()
            raise SourceError("protocol", f"{what}: {exc}") from None
        finally:
            self._last_request = time.monotonic()
        self._check_frame(rr, fc, what)
        if rr.isError():
            code = int(getattr(rr, "exception_code", 0) or 0)
            stats.exceptions[code] += 1
            raise ModbusExceptionReply(code, what)
        values = rr.bits[:count] if fc in (1, 2) else list(rr.registers)
        if len(values) != count:
            raise SourceError("protocol", f"{what}: expected {count} values, got {len(values)}")
        return [int(v) for v in values]

    def _check_frame(self, rr: Any, fc: int, what: str) -> None:
        """Refuse a reply that is not the answer to this request (our transaction ids start at 1 on TCP)."""
        got_fc = int(getattr(rr, "function_code", -1))
        tid = int(getattr(rr, "transaction_id", 0) or 0)
        problem = None
        if got_fc & 0x7F != fc:
            problem = f"reply has function code {got_fc}, asked {fc}"
        elif tid == 0:
            problem = "reply has transaction id 0"
        if problem:
            self._drop()  # the stream cannot be trusted to be in step with our requests any more
            raise SourceError("protocol", f"{what}: {problem}")

    async def _unless_lost(self, coro, what: str):
        """Await a request, but give up at once (not at the timeout) if the connection drops meanwhile."""
        req = asyncio.ensure_future(coro)
        lost = asyncio.ensure_future(self._lost.wait())
        try:
            done, _ = await asyncio.wait({req, lost}, timeout=self.timeout + 0.1, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if req in done:
            return req.result()
        req.cancel()
        if lost in done:
            raise ConnectionException(f"{what}: peer closed the connection")
        raise asyncio.TimeoutError

    @staticmethod
    def _is_timeout(exc: ModbusIOException) -> bool:
        text = str(exc).lower()
        return "no response" in text or "timeout" in text or "not responding" in text

    async def write(self, table: str, address: int, words: list[int], unit: int) -> None:
        what = f"{self.target} unit {unit} write {table} @{address}"
        async with self.lock:
            client = await self._connected()
            try:
                if table == "coil":
                    rr = await asyncio.wait_for(client.write_coil(address, bool(words[0]), device_id=unit), self.timeout + 0.1)
                elif len(words) == 1:
                    rr = await asyncio.wait_for(client.write_register(address, words[0], device_id=unit), self.timeout + 0.1)
                else:
                    rr = await asyncio.wait_for(client.write_registers(address, words, device_id=unit), self.timeout + 0.1)
            except (asyncio.TimeoutError, ModbusException) as exc:
                self._drop()
                raise SourceError("timeout", f"{what}: no answer ({exc or 'timeout'})") from None
            if rr.isError():
                code = int(getattr(rr, "exception_code", 0) or 0)
                self.stats.exceptions[code] += 1
                raise ModbusExceptionReply(code, what)

    def close(self) -> None:
        self._drop()


_GATEWAYS: dict[tuple[int, str, int], Gateway] = {}


def gateway_for(host: str, port: int, timeout: float) -> Gateway:
    """The shared gateway of host:port in the running event loop (created on first use)."""
    key = (id(asyncio.get_running_loop()), host, port)
    gw = _GATEWAYS.get(key)
    if gw is None:
        gw = _GATEWAYS[key] = Gateway(host, port, timeout)
    gw.timeout = min(gw.timeout, timeout)
    gw.users += 1
    return gw


def release_gateway(gw: Gateway) -> None:
    gw.users -= 1
    if gw.users <= 0:
        gw.close()
        for key, value in list(_GATEWAYS.items()):
            if value is gw:
                del _GATEWAYS[key]
