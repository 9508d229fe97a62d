"""Source `imex`: the node's IMEX daemon and its NVLink domain, as `nvidia-imex-ctl` reports them.

IMEX (`nvidia-imex`) is what lets a GB200 GPU import memory another tray's GPU exported: when a tray's daemon is
down or a connection between two daemons is lost, multi-node NVLink jobs fail while every NVLink reads up. Only
the daemon knows, and its control tool is the one interface NVIDIA documents, so this source runs it: `-q` for
the local daemon's state, `-N -j -H` for every domain node's state and the connection matrix. Which words mean
what is in profiles/imex/nvidia-imex-ctl.yaml.

The tool's output is untrusted and its run is bounded: an argument list (never a shell), at most `max_bytes` of
output (more is an error, the process is killed), at most the poll's timeout (then killed too). A missing binary
is the source down with a `config` error naming the command: the exposition then reads `supernode_source_up 0`
for `imex`, never "no IMEX here". Bad output is a `decode` error naming the field or line.
"""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from exporters.errors import ProfileError
from exporters.model import PollResult, Reading, SourceError, gauge
from exporters.safe_yaml import InputError, load_yaml_file

PROFILE = Path(__file__).resolve().parent.parent / "profiles" / "imex" / "nvidia-imex-ctl.yaml"
MAX_OUTPUT_BYTES = 1 << 20  # an 18-tray domain's -N -j is ~20 KB; a megabyte is not the tool's
MAX_NODES = 576  # the largest NVLink domain NVIDIA lists is 576 GPUs: never more nodes than that

DAEMON_STATE = gauge("supernode_imex_daemon_state",
                     "The local IMEX daemon's state (nvidia-imex-ctl -q), a state set: 1 for the current state.",
                     ("state",))
DOMAIN_STATE = gauge("supernode_imex_domain_state",
                     "The IMEX domain's state (nvidia-imex-ctl -N), a state set: 1 for the current state.", ("state",))
NODE_STATUS = gauge("supernode_imex_domain_node_status",
                    "Each IMEX domain node's daemon state as the domain reports it (nvidia-imex-ctl -N), a state set; "
                    "peer: its host name, else its IP.", ("peer", "status"))
CONNECTIONS = gauge("supernode_imex_domain_connections",
                    "Connections between the domain's IMEX daemons by status (nvidia-imex-ctl -N's matrix, each "
                    "node's view of each node); status other: a spelling the profile does not know.", ("status",))
METRICS = (DAEMON_STATE, DOMAIN_STATE, NODE_STATUS, CONNECTIONS)


@dataclass(frozen=True)
class ImexProfile:
    query_args: tuple[str, ...]
    domain_args: tuple[str, ...]
    daemon_states: tuple[str, ...]
    domain_states: tuple[str, ...]
    connection_states: tuple[str, ...]
    ready_state: str
    up_state: str
    connected_state: str
    unknown_hostname: str


@functools.lru_cache(maxsize=None)
def load_profile(path: Path = PROFILE) -> ImexProfile:
    """The IMEX profile; a ProfileError names the file and the field."""
    try:
        data = load_yaml_file(path, "imex profile")
    except InputError as exc:
        raise ProfileError(str(exc)) from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping at the top level")

    def words(key: str) -> tuple[str, ...]:
        value = data.get(key)
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise ProfileError(f"{path}: field {key!r} must be a non-empty list of words")
        return tuple(value)

    def word(key: str, within: tuple[str, ...] | None = None) -> str:
        value = data.get(key)
        if not isinstance(value, str) or not value or (within is not None and value not in within):
            raise ProfileError(f"{path}: field {key!r} must be a word" + (f" of {list(within)}" if within else ""))
        return value

    daemon, domain, conn = words("daemon_states"), words("domain_states"), words("connection_states")
    return ImexProfile(words("query_args"), words("domain_args"), daemon, domain, conn, word("ready_state", daemon),
                       word("up_state", domain), word("connected_state", conn), word("unknown_hostname"))


class ImexOutputError(ValueError):
    """`nvidia-imex-ctl` printed something this parser cannot use; the message names the field or line."""


@dataclass
class DomainStatus:
    """What one `nvidia-imex-ctl -N -j -H` says: the domain's state, each node's, the connections by status."""

    state: str
    nodes: dict[str, str] = field(default_factory=dict)  # peer (host name, else IP) -> daemon state
    connections: dict[str, int] = field(default_factory=dict)  # status (or "other") -> count


def parse_query(text: str, profile: ImexProfile | None = None) -> str:
    """The daemon state `-q` printed: one known word on one line."""
    p = profile or load_profile()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise ImexOutputError(f"nvidia-imex-ctl -q: expected one line with the daemon state, got {len(lines)} lines")
    state = lines[0]
    if state not in p.daemon_states:
        raise ImexOutputError(f"nvidia-imex-ctl -q: line 1: unknown daemon state {state[:40]!r} "
                              f"(known: {', '.join(p.daemon_states)})")
    return state


def _field(obj: Any, key: str, where: str, kind: type) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ImexOutputError(f"nvidia-imex-ctl -N -j: field {where}.{key} missing" if where else
                              f"nvidia-imex-ctl -N -j: field {key} missing")
    value = obj[key]
    if not isinstance(value, kind):
        name = f"{where}.{key}" if where else key
        raise ImexOutputError(f"nvidia-imex-ctl -N -j: field {name} must be a {kind.__name__}, "
                              f"got {type(value).__name__}")
    return value


def parse_domain(text: str, profile: ImexProfile | None = None) -> DomainStatus:
    """The domain as `-N -j -H` reports it; an ImexOutputError names the first field that does not fit."""
    p = profile or load_profile()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImexOutputError(f"nvidia-imex-ctl -N -j: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise ImexOutputError(f"nvidia-imex-ctl -N -j: expected an object, got {type(data).__name__}")
    state = _field(data, "status", "", str)
    if state not in p.domain_states:
        raise ImexOutputError(f"nvidia-imex-ctl -N -j: field status: unknown domain state {state[:40]!r} "
                              f"(known: {', '.join(p.domain_states)})")
    nodes = _field(data, "nodes", "", dict)
    if len(nodes) > MAX_NODES:
        raise ImexOutputError(f"nvidia-imex-ctl -N -j: field nodes: {len(nodes)} nodes, more than {MAX_NODES}")
    out = DomainStatus(state, connections={s: 0 for s in (*p.connection_states, "other")})
    for index, node in nodes.items():
        where = f"nodes.{index}"
        status = _field(node, "status", where, str)
        if status not in p.daemon_states:
            raise ImexOutputError(f"nvidia-imex-ctl -N -j: field {where}.status: unknown node state "
                                  f"{status[:40]!r} (known: {', '.join(p.daemon_states)})")
        host = _field(node, "host", where, str)
        name = node.get("hostName")
        peer = name if isinstance(name, str) and name and name != p.unknown_hostname else host
        if not peer or len(peer) > 253:
            raise ImexOutputError(f"nvidia-imex-ctl -N -j: field {where}.host: not a host ({peer[:40]!r})")
        if peer in out.nodes:
            raise ImexOutputError(f"nvidia-imex-ctl -N -j: field {where}: node {peer!r} listed twice")
        out.nodes[peer] = status
        for to, conn in _field(node, "connections", where, dict).items():
            conn_status = _field(conn, "status", f"{where}.connections.{to}", str)
            key = conn_status if conn_status in p.connection_states else "other"
            out.connections[key] += 1
    return out


def state_set(spec: Any, states: Sequence[str], current: str | None, labels: dict[str, str] | None = None,
              label: str = "state") -> list[Reading]:
    """One reading per known state: 1 for `current`, 0 for the others (the OpenMetrics state-set shape)."""
    base = labels or {}
    return [Reading(spec, 1.0 if s == current else 0.0, {**base, label: s}) for s in states]


def domain_readings(domain: DomainStatus, profile: ImexProfile | None = None) -> list[Reading]:
    p = profile or load_profile()
    out = state_set(DOMAIN_STATE, p.domain_states, domain.state)
    for peer, status in sorted(domain.nodes.items()):
        out += state_set(NODE_STATUS, p.daemon_states, status, {"peer": peer}, label="status")
    out += [Reading(CONNECTIONS, float(n), {"status": s}) for s, n in domain.connections.items()]
    return out


async def _read_bounded(stream: asyncio.StreamReader, limit: int | None, keep: int = 4096) -> bytes | None:
    """Read a pipe to its end: None once more than `limit` bytes came (stop reading); with no limit, drain it
    (a chatty stderr must not fill its pipe and block the tool) and keep its first `keep` bytes."""
    chunks: list[bytes] = []
    total = 0
    while chunk := await stream.read(65536):
        total += len(chunk)
        if limit is not None and total > limit:
            return None
        if limit is not None or total - len(chunk) < keep:
            chunks.append(chunk)
    data = b"".join(chunks)
    return data if limit is not None else data[:keep]


async def run_tool(argv: Sequence[str], max_bytes: int = MAX_OUTPUT_BYTES) -> str:
    """Run one argument list and return its stdout; bounded in size (the caller bounds the time).

    A SourceError says why not: `config` for a binary that is not there (or not executable), `driver` for a
    non-zero exit (with the tool's first line of stderr), `decode` for output over `max_bytes` or not UTF-8."""
    try:
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except FileNotFoundError:
        raise SourceError("config", f"imex: {argv[0]!r} not found (sources.imex.command): is the IMEX package "
                                    f"installed?") from None
    except PermissionError:
        raise SourceError("config", f"imex: {argv[0]!r} is not executable (sources.imex.command)") from None
    assert proc.stdout is not None and proc.stderr is not None
    err_read = asyncio.ensure_future(_read_bounded(proc.stderr, None))
    try:
        out = await _read_bounded(proc.stdout, max_bytes)
        if out is None:
            raise SourceError("decode", f"imex: {' '.join(argv)}: output exceeds {max_bytes} bytes")
        err = await err_read
        await proc.wait()
    finally:
        err_read.cancel()
        if proc.returncode is None:  # timed out by the caller, or too much output: leave nothing behind
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        reason = (err or b"").decode(errors="replace").strip().splitlines()[:1] or [f"exit status {proc.returncode}"]
        raise SourceError("driver", f"imex: {' '.join(argv)}: {reason[0][:200]}")
    try:
        return out.decode()
    except UnicodeDecodeError:
        raise SourceError("decode", f"imex: {' '.join(argv)}: output is not UTF-8") from None


class ImexSource:
    """Source `imex`: one poll runs `-q` and `-N -j -H`, each within the poll's timeout.

    The daemon's own state and the domain's are read apart: with the local daemon down the domain query still
    answers from the other trays' daemons (it reads the config's node list), so one failing is a partial error of
    the poll and the other's readings stand; both failing is the source down."""

    name = "imex"

    def __init__(self, command: Sequence[str], device: str = "imex", timeout: float = 2.0,
                 max_bytes: int = MAX_OUTPUT_BYTES, profile: ImexProfile | None = None):
        if not command:
            raise ValueError("imex: command must name the nvidia-imex-ctl binary")
        self.command = list(command)
        self.device = device
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.profile = profile or load_profile()
        self.last_errors: list[str] = []

    async def _run(self, args: Sequence[str]) -> str:
        argv = [*self.command, *args]
        try:
            async with asyncio.timeout(self.timeout):
                return await run_tool(argv, self.max_bytes)
        except TimeoutError:
            raise SourceError("timeout", f"imex: {' '.join(argv)}: no answer within {self.timeout:.1f}s") from None

    async def _query(self) -> list[Reading]:
        text = await self._run(self.profile.query_args)
        try:
            state = parse_query(text, self.profile)
        except ImexOutputError as exc:
            raise SourceError("decode", str(exc)) from None
        return state_set(DAEMON_STATE, self.profile.daemon_states, state)

    async def _domain(self) -> list[Reading]:
        text = await self._run(self.profile.domain_args)
        try:
            return domain_readings(await asyncio.to_thread(parse_domain, text, self.profile), self.profile)
        except ImexOutputError as exc:
            raise SourceError("decode", str(exc)) from None

    async def poll(self) -> PollResult:
        results = await asyncio.gather(self._query(), self._domain(), return_exceptions=True)
        readings: list[Reading] = []
        errors: list[SourceError] = []
        for r in results:
            if isinstance(r, SourceError):
                errors.append(r)
            elif isinstance(r, BaseException):
                raise r
            else:
                readings.extend(r)
        self.last_errors = [str(e) for e in errors]
        if len(errors) == len(results):
            raise SourceError(errors[0].kind, "; ".join(self.last_errors))
        partial: dict[str, int] = {}
        for e in errors:
            partial[e.kind] = partial.get(e.kind, 0) + 1
        return PollResult(readings, partial)

    async def close(self) -> None:
        return None
