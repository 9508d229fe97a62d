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
as what it claims to be. A reply whose transaction id is 0, whose function
code is not the one asked or whose unit is not the one asked is refused
(SourceError "protocol") and the connection is dropped, so a stray frame can
never read as `leak_detected=1`; a reply with fewer values than asked (a
short byte count) is refused too. pymodbus's own framer already skips a frame
from another unit when the unit asked is not 0 (it never becomes a response:
the request then times out) and a frame for another transaction id (the
answer after it is read).

Per request the client costs what pymodbus's exchange costs and little more:
the request runs in the poll's own task (a dropped connection cancels it at
once, from pymodbus's connection callback, instead of a watcher task racing
it), and its description is formatted only when something goes wrong.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

from pymodbus.client import AsyncModbusTcpClient
from pymodbus.exceptions import ConnectionException, ModbusException, ModbusIOException

from exporters.model import SourceError

log = logging.getLogger(__name__)

T = TypeVar("T")
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


READS = {1: "read_coils", 2: "read_discrete_inputs", 3: "read_holding_registers", 4: "read_input_registers"}


class PeerClosed(Exception):
    """The peer closed the connection while a request waited for its answer."""


class ConnectionDropped(SourceError):
    """The connection died under a request (a `connection` SourceError): worth one retry on a new one."""

    def __init__(self, message: str):
        super().__init__("connection", message)


class Gateway:
    """A shared client for one host:port; all requests go through `lock`."""

    def __init__(self, host: str, port: int, timeout: float):
        self.host, self.port, self.timeout = host, port, timeout
        self.lock = asyncio.Lock()
        self.stats = GatewayStats()
        self._client: AsyncModbusTcpClient | None = None
        self._conn: object | None = None  # this connection's token: a late callback of an older one is ignored
        self._waiting: asyncio.Task | None = None  # the task whose request waits for its answer, if any
        self._closed_under: asyncio.Task | None = None  # that task, cancelled because the peer closed
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
        conn = self._conn = object()
        self._client = AsyncModbusTcpClient(self.host, port=self.port, timeout=self.timeout, retries=0,
                                            reconnect_delay=0, name=f"modbus-{self.target}",
                                            trace_connect=lambda up: None if up else self._peer_closed(conn))
        try:
            async with asyncio.timeout(self.timeout):
                ok = await self._client.connect()
        except asyncio.TimeoutError:
            ok = False
        if not ok:
            self._drop()
            raise SourceError("connection", f"{self.target}: cannot connect")
        return self._client

    def _peer_closed(self, conn: object) -> None:
        """pymodbus says the connection is gone: a request waiting on it fails now, not at its timeout."""
        task = self._waiting
        if conn is self._conn and task is not None and not task.done():
            self._closed_under = task
            task.cancel()

    def _drop(self) -> None:
        if self._client is not None:
            self._conn = None  # our own close is no news to a request
            self._client.close()
            self._client = None

    def _what(self, fc: int, address: int, count: int, unit: int) -> str:
        return f"{self.target} unit {unit} fc{fc} @{address}+{count}"

    async def read(self, fc: int, address: int, count: int, unit: int, gap_s: float = 0.0,
                   busy_retries: int = 3, backoff_s: float = 0.05, stats: GatewayStats | None = None) -> list[int]:
        """Read `count` registers or bits; retries busy/gateway errors and one dropped connection."""
        return await self._retried(lambda: self._read_once(fc, address, count, unit, gap_s, stats or self.stats),
                                   busy_retries, backoff_s)

    async def _retried(self, once: Callable[[], Awaitable[T]], busy_retries: int = 0, backoff_s: float = 0.05) -> T:
        """`once()` under the gateway's lock, tried again on a new connection once if the connection died under it
        (ConnectionDropped), and after a backoff up to `busy_retries` times on a busy or gateway exception reply."""
        attempt_busy = attempt_conn = 0
        while True:
            try:
                async with self.lock:
                    return await once()
            except ModbusExceptionReply as exc:
                if exc.code in RETRY_CODES and attempt_busy < busy_retries:
                    await asyncio.sleep(backoff_s * (2 ** attempt_busy))
                    attempt_busy += 1
                    continue
                raise
            except ConnectionDropped:
                if attempt_conn < 1:
                    attempt_conn += 1  # the connection died under us: reconnect once, then give up
                    continue
                raise

    async def _read_once(self, fc: int, address: int, count: int, unit: int, gap_s: float,
                         stats: GatewayStats) -> list[int]:
        if gap_s:
            wait = self._last_request + gap_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        client = await self._connected()
        stats.requests += 1
        try:
            rr = await self._exchange(getattr(client, READS[fc])(address, count=count, device_id=unit))
        except Exception as exc:
            self._drop()
            raise self._failure(exc, self._what(fc, address, count, unit)) from None
        finally:
            if gap_s:
                self._last_request = time.monotonic()
        self._check_frame(rr, fc, unit, address, count)
        if rr.isError():
            code = int(getattr(rr, "exception_code", 0) or 0)
            stats.exceptions[code] += 1
            raise ModbusExceptionReply(code, self._what(fc, address, count, unit))
        values = rr.bits[:count] if fc < 3 else rr.registers
        if len(values) != count:  # a byte count short of the request: not this request's answer
            raise SourceError("protocol", f"{self._what(fc, address, count, unit)}: expected {count} values, "
                                          f"got {len(values)}")
        return [int(v) for v in values]

    def _check_frame(self, rr: Any, fc: int, unit: int, address: int, count: int) -> None:
        """Refuse a reply that is not the answer to this request (our transaction ids start at 1 on TCP)."""
        got_fc = int(getattr(rr, "function_code", -1))
        problem = None
        if got_fc & 0x7F != fc:
            problem = f"reply has function code {got_fc}, asked {fc}"
        elif not getattr(rr, "transaction_id", 0):
            problem = "reply has transaction id 0"
        elif getattr(rr, "dev_id", unit) != unit:  # pymodbus checks it only when the unit asked is not 0
            problem = f"reply from unit {rr.dev_id}, asked {unit}"
        if problem:
            self._drop()  # the stream cannot be trusted to be in step with our requests any more
            raise SourceError("protocol", f"{self._what(fc, address, count, unit)}: {problem}")

    async def _exchange(self, request: Any) -> Any:
        """Await a pymodbus request in this task, bounded a little past pymodbus's own timeout; a peer that
        closes the connection meanwhile cancels it (`_peer_closed`), which is turned into PeerClosed."""
        task = asyncio.current_task()
        self._waiting, self._closed_under = task, None
        try:
            async with asyncio.timeout(self.timeout + 0.1):
                return await request
        except asyncio.CancelledError:
            if task is None or self._closed_under is not task:
                raise
            task.uncancel()
            raise PeerClosed("peer closed the connection") from None
        finally:
            self._waiting = None

    @staticmethod
    def _is_timeout(exc: ModbusIOException) -> bool:
        text = str(exc).lower()
        return "no response" in text or "timeout" in text or "not responding" in text

    def _failure(self, exc: BaseException, what: str) -> BaseException:
        """What a request that raised `exc` failed of, as the SourceError its caller handles (the connection is
        already dropped). A write on a transport that closed before pymodbus heard of it raises RuntimeError
        on uvloop (asyncio's own loop drops the bytes and the request times out instead): that connection is
        gone too. Anything else is a bug and propagates as it is."""
        if isinstance(exc, asyncio.TimeoutError) or (isinstance(exc, ModbusIOException) and self._is_timeout(exc)):
            return SourceError("timeout", f"{what}: no answer within {self.timeout:.2f}s")
        if isinstance(exc, (ConnectionException, PeerClosed, ModbusIOException)) or (
                isinstance(exc, RuntimeError) and "closed" in str(exc)):
            return ConnectionDropped(f"{what}: connection dropped ({exc})")
        if isinstance(exc, ModbusException):
            return SourceError("protocol", f"{what}: {exc}")
        return exc

    async def write(self, table: str, address: int, words: list[int], unit: int) -> None:
        """Write a coil or registers. A connection that died under the write (closed by the peer, while idle or
        while the write waited) is reopened and the write sent once more: a Modbus write sets absolute values,
        so a write the device did carry out before the connection died leaves the same state when sent twice.
        A valve close must not fail because the gateway closed an idle connection a moment before. An exception
        reply is final (no busy retries: the caller decides)."""
        await self._retried(lambda: self._write_once(table, address, words, unit))

    async def _write_once(self, table: str, address: int, words: list[int], unit: int) -> None:
        client = await self._connected()
        self.stats.requests += 1
        if table == "coil":
            request = client.write_coil(address, bool(words[0]), device_id=unit)
        elif len(words) == 1:
            request = client.write_register(address, words[0], device_id=unit)
        else:
            request = client.write_registers(address, words, device_id=unit)
        try:
            rr = await self._exchange(request)
        except Exception as exc:
            self._drop()
            raise self._failure(exc, f"{self.target} unit {unit} write {table} @{address}") from None
        if rr.isError():
            code = int(getattr(rr, "exception_code", 0) or 0)
            self.stats.exceptions[code] += 1
            raise ModbusExceptionReply(code, f"{self.target} unit {unit} write {table} @{address}")

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
