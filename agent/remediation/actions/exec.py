"""exec: run an allow-listed program with an argument list (never a shell).

Arguments come from the step's `args` list; each may name only target or
incident fields in `{...}` (node, gpu, port, zone, incident_id, detector),
and every substituted value must match a strict pattern, so nothing from an
Alertmanager payload reaches argv unvalidated.
"""

from __future__ import annotations

import re
import string
from typing import Any, Mapping

from ..settings import ExecProgram
from . import ActionError, ActionResult, run_program

SAFE = re.compile(r"^[A-Za-z0-9_.:/@=+-]{1,128}$")
FIELDS = {"node", "gpu", "port", "zone", "cdu", "incident_id", "detector", "link"}


def render_args(args: list[str], values: Mapping[str, Any]) -> list[str]:
    out = []
    for arg in args:
        names = [f for _, f, _, _ in string.Formatter().parse(arg) if f]
        for f in names:
            if f not in FIELDS:
                raise ActionError(f"exec: argument field {{{f}}} is not allowed", guardrail="exec_args")
            if f not in values or not SAFE.match(str(values[f])):
                raise ActionError(f"exec: value of {{{f}}} missing or unsafe: {values.get(f)!r}",
                                  guardrail="exec_args")
        out.append(arg.format(**{f: values[f] for f in names}))
    return out


class ExecAction:
    kind = "exec"

    def __init__(self, allow: Mapping[str, ExecProgram]):
        self.allow = dict(allow)

    def _program(self, params: Mapping[str, Any]) -> ExecProgram:
        name = params.get("program")
        if name not in self.allow:
            raise ActionError(f"exec: program {name!r} not in remediation.exec_allow", guardrail="exec_allow")
        return self.allow[name]

    async def plan(self, target, params, ctx) -> dict:
        prog = self._program(params)
        argv = [str(prog.path), *render_args(list(params.get("args", [])), {**ctx, **target})]
        undo = [str(prog.undo_path), *render_args(list(params.get("undo_args", [])), {**ctx, **target})] \
            if prog.undo_path else None
        # owned: there is something of ours to undo (the engine holds only owned effects for undo)
        return {"before": {"undo_argv": undo, "owned": undo is not None}, "argv": argv}

    async def _run(self, argv: list[str], timeout: float) -> ActionResult:
        try:
            rc, out, err = await run_program(argv, timeout)
        except TimeoutError:
            raise ActionError(f"exec: {argv[0]} timed out") from None
        if rc != 0:
            raise ActionError(f"exec: {argv[0]} exit {rc}: {err[-200:]}")
        return ActionResult(True, f"{argv[0]} exit 0", after={"stdout": out[-500:]})

    async def apply(self, target, params, ctx, plan) -> ActionResult:
        res = await self._run(plan["argv"], self._program(params).timeout_seconds)
        res.before = dict(plan["before"])
        return res

    async def undo(self, target, before, after, params) -> ActionResult:
        if not before.get("undo_argv"):
            return ActionResult(True, "no undo program", skipped=True)
        return await self._run(before["undo_argv"], self._program(params).timeout_seconds)

    async def reconcile(self, target, params, plan) -> str:
        return "unknown"
