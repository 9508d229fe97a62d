"""systemd notification (READY=1, WATCHDOG=1, STOPPING=1) without a dependency: one datagram."""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends to $NOTIFY_SOCKET when set; a no-op otherwise (not under systemd, or Type=simple)."""

    def __init__(self, environ: dict[str, str] | None = None):
        env = os.environ if environ is None else environ
        self.address = env.get("NOTIFY_SOCKET") or None
        usec = env.get("WATCHDOG_USEC")
        self.watchdog_interval: float | None = int(usec) / 1e6 / 2 if usec and usec.isdigit() else None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def notify(self, state: str) -> bool:
        if not self.address:
            return False
        addr = self.address
        if addr.startswith("@"):
            addr = "\0" + addr[1:]  # abstract namespace socket
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(addr)
            sock.sendall(state.encode())
        return True

    def ready(self) -> bool:
        return self.notify("READY=1")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")
