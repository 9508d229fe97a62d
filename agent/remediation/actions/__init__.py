"""Actions: one module per kind, each with apply (act + read back), undo, and reconcile.

Why this shape: the engine journals an intent, calls `apply`, and journals
the result with `before` (what undo needs: the limit, the node state, the
link state recorded before acting) and `after` (the read-back). `reconcile`
answers, after a crash, whether an intent without result took effect, by
reading the real device, never the agent's memory.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol


class ActionError(Exception):
    """An action failed; `permanent` ones are not retried (bad target, refused by the device).

    `guardrail` names a rule of ours that refused the step (a port not marked
    isolatable, a program not allow-listed): the engine journals and counts
    that as blocked by that guardrail, not as a failed action.
    """

    def __init__(self, message: str, permanent: bool = False, guardrail: str | None = None):
        super().__init__(message)
        self.permanent = permanent or guardrail is not None
        self.guardrail = guardrail


async def run_program(argv: list[str], timeout: float, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a program run from an argument list (never a shell).

    Raises TimeoutError after killing it when it runs past `timeout`: a hung
    scontrol or hook must not hold an action, or the engine, forever.
    """
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env=env)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise TimeoutError(f"{argv[0]} timed out after {timeout}s") from None
    return proc.returncode or 0, out.decode(), err.decode()


@dataclass(slots=True)
class ActionResult:
    ok: bool
    message: str = ""
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False  # nothing to do (already in state, not ours to undo)


class Action(Protocol):
    """plan (read state, decide; recorded in the intent) -> apply (act, read back) -> undo; reconcile after a crash."""

    kind: str

    async def plan(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict: ...

    async def apply(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any],
                    plan: Mapping[str, Any]) -> ActionResult: ...

    async def undo(self, target: Mapping[str, str], before: Mapping[str, Any], after: Mapping[str, Any],
                   params: Mapping[str, Any]) -> ActionResult: ...

    async def reconcile(self, target: Mapping[str, str], params: Mapping[str, Any], plan: Mapping[str, Any]) -> str:
        """'applied', 'not_applied' or 'unknown' for an intent found without a result."""
        ...


def target_str(target: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(target.items()))


def parse_target(text: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in text.split(",") if "=" in p)
