"""What one poll of a profile reads: its walked columns (the slow ones only now and then) and its scalar objects.

Why apart from the collectors: a PDU and a CDU read their profile the same
way (one multi-column GETBULK walk, one GET of the scalars), and only the
families they decode into differ. The slowly changing columns (Raritan
decimal digits, ENTITY-SENSOR scale, APC id columns) are read on the first
poll and then every `refresh` seconds.
"""

from __future__ import annotations

import time

from exporters.model import SourceError
from exporters.snmp.client import MAX_CURSORS, SnmpClient
from exporters.snmp.decode import Columns
from exporters.snmp.profile import MetricMap, Profile


class ProfileReader:
    """The objects a set of a profile's metric maps needs, read from one client."""

    def __init__(self, client: SnmpClient, profile: Profile, maps: list[MetricMap] | None = None,
                 max_repetitions: int = 10, refresh: float = 300.0):
        self.client = client
        self.profile = profile
        self.max_repetitions = max_repetitions
        self.refresh = refresh
        maps = profile.metrics if maps is None else maps
        self.fast = [o for _, _, o in profile.walked_columns(slow=False, maps=maps)]
        self.slow = [o for _, _, o in profile.walked_columns(slow=True, maps=maps)]
        self.scalars = [o for _, _, o in profile.walked_columns(maps=maps, scalar=True)]
        self._slow: Columns = {}
        self._slow_at = -1e18

    async def read(self) -> tuple[Columns, bool]:
        """The columns of one poll (scalars as {(): value}, None where the device has no such object), and
        whether the slow columns were read again this time (the caller re-reads its identity then)."""
        now = time.monotonic()
        refresh = now - self._slow_at >= self.refresh
        walked = self.fast + (self.slow if refresh else [])
        columns = await self.client.walk_columns(walked, self.max_repetitions) if walked else {}
        if refresh:
            self._slow = {o: columns.get(o, {}) for o in self.slow}
            self._slow_at = now
        for start in range(0, len(self.scalars), MAX_CURSORS):
            batch = self.scalars[start:start + MAX_CURSORS]
            got = await self.client.get([f"{o}.0" for o in batch])
            for o in batch:
                columns[o] = {(): got.get(f"{o}.0")}
        if not any(columns.get(o) for o in self.fast) and not any(
                columns.get(o, {}).get(()) is not None for o in self.scalars):
            raise SourceError("decode", f"{self.client.where}: profile {self.profile.profile!r} matched no rows "
                                        f"(walked {len(self.fast)} columns, none of {len(self.scalars)} scalars "
                                        f"answered; wrong profile or community/context?)")
        return {**columns, **self._slow}, refresh

    async def identity(self, known: dict[str, str]) -> dict[str, str]:
        """The profile's identity scalars (model, firmware, serial) read again, or `known` where they cannot be:
        identity is optional (a device without them still has its readings), but a timeout or a refused login
        is the device's failure and propagates."""
        if not self.profile.info:
            return known
        try:
            got = await self.client.get(list(self.profile.info.values()))
        except SourceError as exc:
            if exc.kind in ("timeout", "auth"):
                raise
            return known
        return {k: str(got[o]) for k, o in self.profile.info.items()
                if isinstance(got.get(o), (str, int)) and got[o] != ""}
