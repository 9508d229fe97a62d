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

The window runs on the caller's monotonic clock (the snapshot's), never on the
readings' wall-clock timestamps: those only tell a new sample from the same one
seen again. Mixing the two kept every sample forever (a monotonic "now" minus a
wall-clock time is never older than the window): the agent's memory grew by a
sample per CDU poll and each evaluation walked all of them. The highest flow is
kept as a falling run of samples (a sample below a newer one can never be the
window's highest again) and the ΔT mean as a running sum, so an evaluation costs
the same at any window length.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Cdu:
    # (monotonic time, flow), flows falling from left to right: the leftmost is the window's highest.
    flow: deque[tuple[float, float]] = field(default_factory=deque)
    # (monotonic time, ΔT) of every healthy sample in the window, and their sum.
    delta_t: deque[tuple[float, float]] = field(default_factory=deque)
    delta_t_sum: float = 0.0
    last_ts: float | None = None  # the newest sample's own (reading) timestamp
    setpoint: float | None = None
    settle_until: float | None = None


def _expired(samples: deque[tuple[float, float]], now: float, window_s: float) -> list[tuple[float, float]]:
    """Drop (and return) samples older than the window, but keep the newest one (the last known healthy value)."""
    gone = []
    while len(samples) > 1 and now - samples[0][0] > window_s:
        gone.append(samples.popleft())
    return gone


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
            st.delta_t_sum = 0.0
            st.settle_until = now + self.settle_s
        return changed

    def settling(self, cdu: str, now: float) -> bool:
        st = self._cdu(cdu)
        return st.settle_until is not None and now < st.settle_until

    def flow(self, cdu: str, now: float) -> float | None:
        """Highest healthy flow of the window, or None before the first sample."""
        st = self._cdu(cdu)
        _expired(st.flow, now, self.window_s)
        return st.flow[0][1] if st.flow else None

    def delta_t(self, cdu: str, now: float) -> float | None:
        """Mean healthy ΔT of the window, or None before the first sample with both temperatures."""
        st = self._cdu(cdu)
        for _, gone in _expired(st.delta_t, now, self.window_s):
            st.delta_t_sum -= gone
        if not st.delta_t:
            return None
        if len(st.delta_t) == 1:  # exact again: rounding in the running sum never outlives a window
            st.delta_t_sum = st.delta_t[0][1]
        return st.delta_t_sum / len(st.delta_t)

    def retained(self, cdu: str) -> int:
        """Samples held for `cdu` (flow and ΔT): bounded by the window, whatever the agent's uptime."""
        st = self._cdu(cdu)
        return len(st.flow) + len(st.delta_t)

    def add(self, cdu: str, ts: float, flow: float, delta_t: float | None, now: float) -> None:
        """A healthy sample read at `ts` (its reading's timestamp), seen at monotonic `now`.

        Each reading once: a snapshot re-evaluated with the same sample adds nothing."""
        st = self._cdu(cdu)
        if st.last_ts is not None and ts <= st.last_ts:
            return
        st.last_ts = ts
        while st.flow and st.flow[-1][1] <= flow:
            st.flow.pop()
        st.flow.append((now, flow))
        if delta_t is not None:
            st.delta_t.append((now, delta_t))
            st.delta_t_sum += delta_t
