"""Each GPU's learnt cold-plate thermal resistance at comparable flow, kept in the agent's state dir across restarts.

Why persisted: a plate fouls over weeks, and the point of a baseline is to remember what the plate read when it
was clean. An agent restart (an upgrade, a reboot) that forgot it would make the fouled plate its own new normal.
Why per flow band: R falls as the coolant flow through the plate rises (the film coefficient grows with velocity),
so R read at another pump speed is no evidence about the plate; the secondary flow is cut into bands of
`band_ratio` (geometric: 10 % bands by default) and each band learns on its own.

How it learns: a band's baseline is the mean of its gated, smoothed R over its first `learn_seconds` of loaded
time; once learnt it only follows R down (a cleaned plate, a better pad after service), never up, so a plate that
fouls slowly never drags its reference with it. Keyed by GPU UUID: a replaced GPU (a new plate) starts afresh.
A deleted file starts every baseline afresh (the runbook's step after a plate was cleaned).

The file is written atomically (a temporary file renamed over it), at most every `persist_seconds`, when a band
has just been learnt, and at stop. A file that cannot be read or does not parse is set aside as `.corrupt` and
every baseline starts afresh, said in the log: a bad file never stops the agent nor becomes a baseline.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "thermal-resistance-baselines.json"
VERSION = 1
FOLLOW_DOWN = 0.05  # share of the gap a learnt baseline moves towards a lower R at each sample


@dataclass
class Band:
    r: float  # the baseline (learning: the running mean so far), K/W
    learnt_s: float = 0.0  # gated seconds learnt so far
    samples: int = 0

    def learnt(self, learn_seconds: float) -> bool:
        return self.learnt_s >= learn_seconds


def flow_band(flow: float, band_ratio: float) -> int:
    """The band a secondary flow (m^3/s, > 0) falls in: geometric bands of `band_ratio` width."""
    return int(math.floor(math.log(flow) / math.log1p(band_ratio)))


class ThermalBaselines:
    """uuid -> flow band -> Band; `path` None keeps them in memory only (a test, or no state dir)."""

    def __init__(self, path: Path | None, learn_seconds: float, persist_seconds: float):
        self.path = path
        self.learn_seconds = learn_seconds
        self.persist_seconds = persist_seconds
        self.gpus: dict[str, dict[int, Band]] = {}
        self._dirty = False
        self._written_at: float | None = None
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("thermal baselines unreadable, learning afresh", extra={"path": str(path), "error": str(exc)})
            return
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("gpus"), dict):
                raise ValueError(f"expected {{version: {VERSION}, gpus: {{...}}}}")
            gpus: dict[str, dict[int, Band]] = {}
            for uuid, bands in data["gpus"].items():
                if not isinstance(bands, dict):
                    raise ValueError(f"gpus.{uuid}: expected a mapping of flow bands")
                for band, b in bands.items():
                    r, learnt_s, samples = float(b["r"]), float(b["learnt_s"]), int(b["samples"])
                    if not (math.isfinite(r) and r > 0 and math.isfinite(learnt_s) and learnt_s >= 0 and samples >= 0):
                        raise ValueError(f"gpus.{uuid}.{band}: r must be > 0, learnt_s and samples >= 0")
                    gpus.setdefault(str(uuid), {})[int(band)] = Band(r, learnt_s, samples)
        except (ValueError, TypeError, KeyError) as exc:
            aside = path.with_name(path.name + ".corrupt")
            try:
                os.replace(path, aside)
            except OSError:
                pass
            log.warning("thermal baselines file is not valid, set aside; learning afresh",
                        extra={"path": str(path), "moved_to": str(aside), "error": str(exc)})
            return
        self.gpus = gpus

    def baseline(self, uuid: str, band: int) -> float | None:
        """The learnt baseline of that GPU in that flow band; None while it is still learning (or never seen)."""
        b = self.gpus.get(uuid, {}).get(band)
        return b.r if b is not None and b.learnt(self.learn_seconds) else None

    def learning(self, uuid: str, band: int) -> float:
        """Share (0-1) of its learning time the band has had."""
        b = self.gpus.get(uuid, {}).get(band)
        return 0.0 if b is None else min(1.0, b.learnt_s / self.learn_seconds)

    def add(self, uuid: str, band: int, r: float, dt: float) -> None:
        """One gated, smoothed sample of R, `dt` seconds of loaded time after the previous one."""
        bands = self.gpus.setdefault(uuid, {})
        b = bands.get(band)
        if b is None:
            bands[band] = Band(r, dt, 1)
        elif not b.learnt(self.learn_seconds):
            b.samples += 1
            b.r += (r - b.r) / b.samples
            b.learnt_s += dt
            if b.learnt(self.learn_seconds):
                self._written_at = None  # just learnt: on disk at the next save, not a persist period later
        elif r < b.r:
            b.r += (r - b.r) * FOLLOW_DOWN
        else:
            return
        self._dirty = True

    def pending(self, now: float, force: bool = False) -> dict | None:
        """The file's content if it is due to be written (something changed and the persist period passed, or
        `force`), else None. Built on the caller's thread (the event loop's, where `add` runs), so `write` can
        run on another without reading a dict being changed."""
        if self.path is None or not self._dirty:
            return None
        if not force and self._written_at is not None and now - self._written_at < self.persist_seconds:
            return None
        self._written_at, self._dirty = now, False  # a failed write sets it dirty again
        return {"version": VERSION, "gpus": {u: {str(k): {"r": b.r, "learnt_s": b.learnt_s, "samples": b.samples}
                                                 for k, b in sorted(bands.items())}
                                             for u, bands in sorted(self.gpus.items())}}

    def write(self, data: dict) -> bool:
        """Write `pending`'s content atomically (a temporary file renamed over the file); blocking (fsync)."""
        assert self.path is not None
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(data, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:  # a full disk: kept in memory, tried again next period
            log.warning("thermal baselines not saved", extra={"path": str(self.path), "error": str(exc)})
            self._dirty = True
            return False
        return True

    def save(self, now: float, force: bool = False) -> bool:
        """`pending` and `write` on this thread; True when written."""
        data = self.pending(now, force)
        return data is not None and self.write(data)
