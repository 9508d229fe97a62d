"""The legacy-BACpypes device of sim/bacnet_device.py, run as a child process and driven from asyncio.

Used by the simulator's BACnet CDU (sim/bacnet_cdu.py) and by the tests, which need a BACnet stack that is not the
agent's own (bacpypes3) on loopback: the same server either way, so the demo's CDU and the tested one agree.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from typing import Any, Callable

from sim.ports import free_port

START_TIMEOUT_S = 30.0  # legacy BACpypes imports in ~1 s; a loaded 2-core machine can take many times that


class BacnetDeviceProcess:
    """One BACnet/IP device on 127.0.0.1:`port` serving `profile`; `command` waits for the device's ack, so what it
    set is served when it returns. `on_write(point, value)` hears a client's write of a control point."""

    def __init__(self, profile: str, port: int = 0, *, instance: int = 1001, no_rpm: bool = False,
                 no_cov: bool = False, on_write: Callable[[str, Any], None] | None = None):
        self.profile = profile
        self.port = port or free_port(socket.SOCK_DGRAM)
        self.instance = instance
        self.flags = (["--no-rpm"] if no_rpm else []) + (["--no-cov"] if no_cov else [])
        self.on_write = on_write
        self.proc: asyncio.subprocess.Process | None = None
        self._acks: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._lock = asyncio.Lock()
        self._reader: asyncio.Task | None = None
        self.errors: list[str] = []

    @property
    def endpoint(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    async def start(self) -> None:
        env = {**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"}  # asyncore's, in the child only
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sim.bacnet_device", "--profile", self.profile, "--port", str(self.port),
            "--instance", str(self.instance), *self.flags, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env=env, limit=1 << 20)
        assert self.proc.stdout is not None
        async with asyncio.timeout(START_TIMEOUT_S):
            line = await self.proc.stdout.readline()
        if not line.startswith(b'{"ready"'):
            raise RuntimeError(f"BACnet device {self.profile} did not start: {line[:200]!r}")
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                return
            msg = json.loads(line)
            if "write" in msg and self.on_write is not None:
                self.on_write(msg["write"]["point"], msg["write"]["value"])
            elif "error" in msg:
                self.errors.append(msg["error"])
            elif "ack" in msg or "stats" in msg:
                await self._acks.put(msg)

    async def command(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Send one command; returns what the device answered before its ack (the stats, or {})."""
        if self.proc is None or self.proc.stdin is None:
            raise RuntimeError("BACnet device not started")
        async with self._lock:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            await self.proc.stdin.drain()
            answer: dict[str, Any] = {}
            async with asyncio.timeout(START_TIMEOUT_S):
                while True:
                    got = await self._acks.get()
                    if "ack" in got:
                        return answer
                    answer = got

    async def stats(self) -> dict[str, int]:
        """Requests the device received, by APDU class (ReadPropertyMultipleRequest, SubscribeCOVRequest...)."""
        return (await self.command({"stats": True})).get("stats", {})

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()  # the device stops when its stdin closes
        try:
            async with asyncio.timeout(5):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
        if self._reader is not None:
            self._reader.cancel()
