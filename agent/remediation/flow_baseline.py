"""Rolling per-CDU baselines of secondary flow and ΔT that follow the pump speed set point.

Why: comparing flow with the highest value since the process started made a
deliberate set point change look like a pump failure (lowering a CDU's pump
set point capped the whole rack until the agent restarted). The flow
baseline here is the highest *healthy* flow of the last window; a set point
change empties it and waits `settle_s` for the loop to settle before it
starts again from the new flow. Samples taken while flow is low are not
added (the caller decides), and the newest healthy sample outlives the
window, so a lasting fault never becomes the new normal. The ΔT baseline is
the mean of the healthy samples' return - supply, for the cross-check.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Cdu:
    flow: deque[tuple[float, float]] = field(default_factory=deque)
    delta_t: deque[tuple[float, float]] = field(default_factory=deque)
    last_ts: float | None = None
    setpoint: float | None = None
    settle_until: float | None = None


def _prune(samples: deque[tuple[float, float]], now: float, window_s: float) -> None:
    """Drop samples older than the window, but keep the newest one (the last known healthy value)."""
    while len(samples) > 1 and now - samples[0][0] > window_s:
        samples.popleft()


class FlowBaselines:
    def __init__(self, window_s: float, settle_s: float):
        self.window_s = window_s
        self.settle_s = settle_s
        self.cdus: dict[str, _Cdu] = {}

    def _cdu(self, cdu: str) -> _Cdu:
        return self.cdus.setdefault(cdu, _Cdu())

    def setpoint(self, cdu: str, value: float, now: float) -> bool:
        """Record the pump speed set point; a change restarts the baselines after the settle time. True on change."""
        st = self._cdu(cdu)
        changed = st.setpoint is not None and abs(value - st.setpoint) > 1e-6
        st.setpoint = value
        if changed:
            st.flow.clear()
            st.delta_t.clear()
            st.settle_until = now + self.settle_s
        return changed

    def settling(self, cdu: str, now: float) -> bool:
        st = self._cdu(cdu)
        return st.settle_until is not None and now < st.settle_until

    def flow(self, cdu: str, now: float) -> float | None:
        """Highest healthy flow of the window, or None before the first sample."""
        st = self._cdu(cdu)
        _prune(st.flow, now, self.window_s)
        return max((v for _, v in st.flow), default=None)

    def delta_t(self, cdu: str, now: float) -> float | None:
        """Mean healthy ΔT of the window, or None before the first sample with both temperatures."""
        st = self._cdu(cdu)
        _prune(st.delta_t, now, self.window_s)
        return sum(v for _, v in st.delta_t) / len(st.delta_t) if st.delta_t else None

    def add(self, cdu: str, ts: float, flow: float, delta_t: float | None) -> None:
        """A healthy sample (each reading once: a snapshot re-evaluated with the same sample adds nothing)."""
        st = self._cdu(cdu)
        if st.last_ts is not None and ts <= st.last_ts:
            return
        st.last_ts = ts
        st.flow.append((ts, flow))
        if delta_t is not None:
            st.delta_t.append((ts, delta_t))
