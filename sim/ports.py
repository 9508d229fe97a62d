"""Loopback ports for the simulator's peers, the demo, the tests and the benches.

Why not `bind(("127.0.0.1", 0))`: the kernel hands out such ports from the ephemeral range, the same range it
takes every outgoing connection's local port from. Between picking a port and the peer binding it (etcd takes a
few hundred milliseconds to start), any connection made on the machine, including the health probes that wait
for that very peer, can take it, and the peer then exits with "address already in use". A port below the
ephemeral range is never given to an outgoing connection; the ones this process has handed out are remembered,
so two peers started together never get the same one.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

_FALLBACK_LOW = 32768  # Linux's default first ephemeral port
_FLOOR = 10000  # below this live well-known services (and Debian peers' defaults such as 2379, 6817)
_given: set[tuple[int, int]] = set()
_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_LOW


def _bindable(port: int, kind: int) -> bool:
    with socket.socket(socket.AF_INET, kind) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _slice(low: int, high: int) -> tuple[int, int]:
    """This process's share of [low, high]: `SUPERNODE_PORT_SLICE=i/n` (set by the test suite for each of its n
    parallel workers) gives the i-th of n equal parts, so two workers never hand out the same port: the
    "handed out before" memory below is per process and cannot see another worker's choices."""
    raw = os.environ.get("SUPERNODE_PORT_SLICE", "")
    try:
        i, n = (int(x) for x in raw.split("/"))
    except ValueError:
        return low, high
    if not 0 <= i < n:
        return low, high
    width = (high - low + 1) // n
    return low + i * width, low + (i + 1) * width - 1


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 that is free now, outside the ephemeral range, not handed out before by this process."""
    high = _ephemeral_low() - 1
    if high - _FLOOR < 1000:  # a machine whose ephemeral range starts low: fall back to the kernel's choice
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    low, high = _slice(_FLOOR, high)
    with _lock:
        for _ in range(1000):
            port = random.randint(low, high)
            if (kind, port) not in _given and _bindable(port, kind):
                _given.add((kind, port))
                return port
    raise OSError(f"no free loopback port between {low} and {high}")
