"""A small asyncio SNMP client: multi-column GETBULK walks, GET and SET, numeric OIDs only.

Why its own module: the collector, the outlet switch and the probe all talk
to a device the same way, and every transport failure must become one
`SourceError` kind (timeout, auth, protocol) that `supernode_source_errors_total`
can count. v2c goes over one UDP socket per device with the agent's own BER
codec (snmp_v2c: pysnmp's engine cost ~4 ms CPU per request); v3 needs USM
and stays on pysnmp's engine (exporters/snmp/v3.py, imported only when a
device speaks v3: pysnmp and its crypto cost ~30 MB of resident memory). Walking several columns in one GETBULK, and
from the second walk on splitting long columns into segments at the rows
seen last time (snmp_exporter walks one subtree per request chain), keeps
the request count per poll low.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exporters.snmp import v2c as snmp_v2c
from exporters.model import SourceError
from exporters.snmp.v2c import END, TOO_BIG, Oid, error_name

@dataclass(frozen=True)
class SnmpCredentials:
    """Plain secret values (the agent resolves secret names to these); never logged."""

    version: str = "2c"
    community: str | None = None
    v3_user: str | None = None
    auth_key: str | None = None
    priv_key: str | None = None
    auth_protocol: str = "SHA"
    priv_protocol: str = "AES"
    context: str = ""

    def __repr__(self) -> str:  # secrets stay out of logs and tracebacks
        return f"SnmpCredentials(version={self.version!r}, v3_user={self.v3_user!r})"

    def check(self) -> None:
        """Refuse what cannot work before any request: the message names what is missing."""
        if self.version == "2c":
            if not self.community:
                raise SourceError("config", "SNMP v2c needs a community")
            return
        if self.version != "3":
            raise SourceError("config", f"SNMP version {self.version!r} not supported (2c or 3)")
        if not self.v3_user:
            raise SourceError("config", "SNMP v3 needs a user")


def credentials(community: str | None = None, v3_user: str | None = None, auth_key: str | None = None,
                priv_key: str | None = None, auth_protocol: str = "SHA", priv_protocol: str = "AES",
                context: str = "") -> SnmpCredentials:
    """v3 when a user is given, else v2c with the community (default public): what `probe snmp` and the one-shot
    probes build from their arguments."""
    if v3_user:
        return SnmpCredentials("3", v3_user=v3_user, auth_key=auth_key, priv_key=priv_key,
                               auth_protocol=auth_protocol, priv_protocol=priv_protocol, context=context)
    return SnmpCredentials("2c", community=community or "public")


Varbinds = list[tuple[Oid, Any]]  # (oid, python value or END)
MAX_CURSORS = 48  # varbinds per GETBULK request at most (x max-repetitions in the response)
# A walk's bounds (issue 18: an agent that never ends a column ran a probe until it was killed). The
# largest PDUs have a few thousand rows per column (outlets x sensor types); these leave a wide margin.
MAX_ROWS = 10_000  # rows of one column in one walk
MAX_REQUESTS = 500  # GETBULK requests of one walk


class _V2cBackend:
    """v2c without pysnmp's engine: snmp_v2c's codec over one UDP socket per device."""

    def __init__(self, host: str, port: int, credentials: SnmpCredentials, timeout: float, retries: int):
        credentials.check()
        self._t = snmp_v2c.V2cTransport(host, port, credentials.community or "", timeout, retries)

    async def get(self, oids: list[Oid]) -> tuple[int, int, Varbinds]:
        return await self._t.request(snmp_v2c.GET, [(o, snmp_v2c.NULL) for o in oids])

    async def bulk(self, oids: list[Oid], max_repetitions: int) -> tuple[int, int, Varbinds]:
        return await self._t.request(snmp_v2c.GETBULK, [(o, snmp_v2c.NULL) for o in oids], 0, max_repetitions)

    async def set_int(self, oid: Oid, value: int) -> tuple[int, int, Varbinds]:
        return await self._t.request(snmp_v2c.SET, [(oid, snmp_v2c.integer(value))])

    def close(self) -> None:
        self._t.close()


def _oid(text: str) -> Oid:
    try:
        return tuple(int(p) for p in text.strip(".").split("."))
    except ValueError:
        raise SourceError("config", f"OID {text!r} is not numeric") from None


class _Cursor:
    """One walk position: column `col`, last OID seen `pos`, and the last row it must read (None: column end)."""

    __slots__ = ("col", "pos", "bound")

    def __init__(self, col: str, pos: Oid, bound: Oid | None):
        self.col, self.pos, self.bound = col, pos, bound


class SnmpClient:
    """One transport per device (v2c: own codec; v3: pysnmp engine); counts requests (benchmark and probe)."""

    def __init__(self, host: str, port: int, credentials: SnmpCredentials, timeout: float = 1.0, retries: int = 1,
                 max_rows: int = MAX_ROWS, max_requests: int = MAX_REQUESTS):
        if max_rows < 1 or max_requests < 1:
            raise SourceError("config", f"{host}:{port}: max_rows and max_requests must be at least 1")
        self.where = f"{host}:{port}"
        credentials.check()
        if credentials.version == "2c":
            self._backend: Any = _V2cBackend(host, port, credentials, timeout, retries)
        else:
            from exporters.snmp.v3 import EngineBackend

            self._backend = EngineBackend(host, port, credentials, timeout, retries)
        self.max_rows, self.max_requests = max_rows, max_requests
        # column -> the row indexes (OID suffixes) of its last walk, in order: how many segments it needs, and
        # where they part
        self._rows: dict[str, list[Oid]] = {}
        # Varbinds in the largest GETBULK answer the agent cut short (fewer than asked, none at the end of its MIB):
        # an agent that caps answers (snmpsim near 60) reads no more rows per request with more cursors, so more
        # segments than that cap allows only cost requests. 0 = never seen a cut answer.
        self._answer_cap = 0
        self.requests = 0

    async def get(self, oids: list[str]) -> dict[str, int | str | None]:
        self.requests += 1
        status, index, vbs = await self._backend.get([_oid(o) for o in oids])
        if status:
            raise SourceError("protocol", f"{self.where}: GET error {error_name(status)} at {index}")
        return {".".join(map(str, o)): None if v is END else v for o, v in vbs}

    async def set_int(self, oid: str, value: int) -> None:
        self.requests += 1
        status, _, _ = await self._backend.set_int(_oid(oid), value)
        if status:
            raise SourceError("protocol", f"{self.where}: SET {oid}={value} refused: {error_name(status)}")

    def _cursors(self, oids: list[str], prefixes: dict[str, Oid], max_repetitions: int) -> list[_Cursor]:
        """One cursor per column, or several for a column whose last walk needed more than one GETBULK.

        Segment k of a column reads the rows after boundary k-1 up to and
        including boundary k (rows of the last walk), the last one up to the
        column end: together they cover the whole column whatever changed
        since, and unchanged they finish in one request.
        """
        # a segment reads up to max_repetitions rows; the last one also needs the varbind past the column end
        want = {o: -(-(len(self._rows.get(o, ())) + 1) // max_repetitions) for o in oids}
        total = sum(want.values())
        budget = min(MAX_CURSORS, max(1, self._answer_cap // max_repetitions)) if self._answer_cap else MAX_CURSORS
        out: list[_Cursor] = []
        for o in oids:
            n = want[o] if total <= budget else max(1, want[o] * budget // total)
            rows, prefix = self._rows.get(o, []), prefixes[o]
            bounds = [prefix + rows[k * (len(rows) + 1) // n - 1] for k in range(1, n)]
            out += [_Cursor(o, start, bound) for start, bound in zip([prefix] + bounds, bounds + [None])]
        return out

    async def walk_columns(self, oids: list[str], max_repetitions: int = 10) -> dict[str, dict[tuple[int, ...], Any]]:
        """Walk several table columns together; returns column oid -> {index tuple: value}.

        Each GETBULK carries the current position of every column (segment)
        still inside its range, so a 3-column table of 24 rows with
        max-repetitions 10 costs 3 requests instead of 9 the first time, and
        1 from then on. A tooBig answer halves max-repetitions, then the
        varbinds per request.

        Device answers are untrusted: an OID that does not increase within
        its column, a column longer than `max_rows` or a walk needing more
        than `max_requests` requests is a `SourceError("protocol")`, never a
        silently short column or an endless walk.
        """
        out: dict[str, dict[tuple[int, ...], Any]] = {o: {} for o in oids}
        prefixes = {o: _oid(o) for o in oids}
        pending = self._cursors(oids, prefixes, max_repetitions)
        split = {o: sum(c.col == o for c in pending) > 1 for o in oids}
        reps, limit = max_repetitions, MAX_CURSORS
        sent = 0
        while pending:
            batch = pending[:limit]
            if sent >= self.max_requests:
                raise SourceError("protocol", f"{self.where}: walk not finished after {self.max_requests} requests "
                                              f"(max_walk_requests)")
            sent += 1
            self.requests += 1
            status, index, vbs = await self._backend.bulk([c.pos for c in batch], reps)
            if status == TOO_BIG and (reps > 1 or len(batch) > 1):
                reps, limit = (reps // 2, limit) if reps > 1 else (reps, len(batch) // 2)
                continue
            if status:
                raise SourceError("protocol", f"{self.where}: GETBULK error {error_name(status)} at {index}")
            if not vbs:
                raise SourceError("protocol", f"{self.where}: empty GETBULK response")
            if len(vbs) < len(batch) * reps and all(v is not END for _, v in vbs):
                self._answer_cap = max(self._answer_cap, len(vbs))
            n = len(batch)  # a GETBULK answer is rows of one varbind per cursor, in cursor order
            pending = [c for k, c in enumerate(batch)
                       if not self._advance(c, vbs[k::n], prefixes[c.col], out[c.col])] + pending[limit:]
        for o in oids:
            if split[o]:  # segments fill a column out of order: rows go back in OID order
                out[o] = dict(sorted(out[o].items()))
            self._rows[o] = list(out[o])
        return out

    def _advance(self, c: _Cursor, answer: list[tuple[Oid, Any]], prefix: Oid, column: dict[Oid, Any]) -> bool:
        """Take one cursor's varbinds of an answer into its column; True once the cursor reached its end (the
        end of the MIB view, the column's, or its segment's bound)."""
        plen, bound, pos = len(prefix), c.bound, c.pos
        try:
            for oid, value in answer:
                if value is END:
                    return True
                if oid <= pos:
                    raise SourceError("protocol", f"{self.where}: OID not increasing in column {c.col} "
                                                  f"({'.'.join(map(str, oid))} after {'.'.join(map(str, pos))})")
                if oid[:plen] != prefix or (bound is not None and oid > bound):
                    return True
                if len(column) >= self.max_rows:
                    raise SourceError("protocol", f"{self.where}: column {c.col} has more than {self.max_rows} rows "
                                                  f"(max_walk_rows)")
                column[oid[plen:]] = value
                pos = oid
                if oid == bound:
                    return True
            return False
        finally:
            c.pos = pos

    def close(self) -> None:
        self._backend.close()
