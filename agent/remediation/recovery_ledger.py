"""What the GPU recovery ladder's steps did, per node and GPU: the judge's proof that a fault was recovered.

Why a ledger of its own: an XID is an event, not a state. After a reset-class XID the GPU may read healthy
while the catalogue still asks for a reset, so the GPU fault judge (agent/remediation/gpu_faults.py) keeps
the fault outstanding until a recovery that ran after it succeeded, and escalates when one failed. The
engine's step runner records every gpu_reset and node_reboot result here (done or failed, with why); the
judge only reads it. A reboot covers every GPU of its node (gpu None).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

RECOVERY_ACTIONS = ("gpu_reset", "node_reboot")
_KEEP = 64  # per node: recoveries are rare; the newest are what the judge asks about


@dataclass(frozen=True, slots=True)
class Recovery:
    node: str
    gpu: str | None  # None: the whole node (a reboot)
    action: str  # one of RECOVERY_ACTIONS
    ok: bool
    at: float  # the engine's clock when the result was recorded
    why: str = ""

    def covers(self, node: str, gpu: str | None) -> bool:
        return self.node == node and (self.gpu is None or gpu is None or self.gpu == gpu)


class RecoveryLedger:
    """Thread-safe: the step runner records on the loop, the detectors read on the publishing thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_node: dict[str, list[Recovery]] = {}

    def record(self, rec: Recovery) -> None:
        if rec.action not in RECOVERY_ACTIONS:
            raise ValueError(f"not a recovery action: {rec.action!r}")
        with self._lock:
            rows = self._by_node.setdefault(rec.node, [])
            rows.append(rec)
            del rows[:-_KEEP]

    def since(self, node: str, gpu: str | None, t: float) -> list[Recovery]:
        """The recoveries that cover (node, gpu) recorded at or after `t`, oldest first."""
        with self._lock:
            return [r for r in self._by_node.get(node, ()) if r.at >= t and r.covers(node, gpu)]
