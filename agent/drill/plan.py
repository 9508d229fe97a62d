"""A drill plan: what fault to fake, where the agent may act, what runs for real, and the targets per stage.

Why strict: a drill runs on a production rack. A plan with an unknown field, a stage target that is not a
number or an action name nobody knows is refused with the field named, never run with a default guessed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from exporters.safe_yaml import InputError, load_yaml_file
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .scenarios import Rack, Scenario, acted_on, describe

# Scheduler actions: they move jobs, never hardware. `checkpoint_signal` and `resume` are the drain's own parts
# (the signal before it, the resume as its undo), so they are real exactly when `drain` is.
SCHEDULER_ACTIONS = ("drain", "checkpoint_signal", "requeue", "resume")
# What a drill never does for real unless the plan lists it under `real` (the approval is still asked).
DESTRUCTIVE_ACTIONS = ("cdu_write", "tray_power", "pdu_outlet", "gpu_reset", "node_reboot")
# Kept real in every drill: they change no hardware state that outlives the drill's undo.
ALWAYS_REAL = ("notify", "gpu_power_cap", "job_notify")
# The stage a drill's fault is mitigated at, by the action its playbook takes: a drain (leak, tray leak, link
# down, a reset- or reboot-class XID), the caps (flow loss), the notice (switch fault), the job told (app XID).
ACTION_STAGE = {"drain": "drained", "gpu_power_cap": "capped", "notify": "notified", "job_notify": "job_notified"}
STAGES = ("detected", "decided", *ACTION_STAGE.values(), "signal_delivered", "job_requeued", "job_resumed",
          "undo_done")
JOB_STAGES = ("signal_delivered", "job_requeued", "job_resumed")
DRILL_SAFE = "drill-safe"  # a job whose Slurm comment contains this word may run on a drilled node

DEFAULT_TARGETS = {"detected": 5.0, "decided": 10.0, "drained": 30.0, "capped": 30.0, "notified": 30.0,
                   "job_notified": 30.0, "signal_delivered": 30.0, "job_requeued": 60.0, "job_resumed": 180.0,
                   "undo_done": 120.0}


class PlanError(ValueError):
    """A plan that cannot run; the message names the field."""


class DrillRefused(Exception):
    """The drill did not start here; the message says why (a plan field, a foreign job, a drill already running)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobCheck(_Strict):
    log: Path = Field(description="the reference job's event log (examples/drill_job.py --log), which the agent "
                                  "reads to confirm the checkpoint and the resume")


class Abort(_Strict):
    after_seconds: float = Field(default=900.0, gt=0, description="undo everything if the drill has not ended")


class DrillPlan(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    scenario: Scenario
    nodes: list[str] = Field(min_length=1, description="the only nodes the drill may touch")
    real: list[Literal[SCHEDULER_ACTIONS + DESTRUCTIVE_ACTIONS]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(SCHEDULER_ACTIONS))
    job: JobCheck | None = None
    hold_seconds: float = Field(default=0.0, ge=0, description="keep the fault this long after the drill's "
                                "course (drain, job resumed) before ending it")
    targets: dict[Literal[STAGES], float] = Field(default_factory=dict)  # type: ignore[valid-type]
    abort: Abort = Field(default_factory=Abort)

    @model_validator(mode="after")
    def _consistent(self) -> "DrillPlan":
        for part in ("checkpoint_signal", "resume"):
            if part in self.real and "drain" not in self.real:
                raise ValueError(f"real: {part} is part of drain: list drain too")
        for stage, seconds in self.targets.items():
            if seconds <= 0:
                raise ValueError(f"targets.{stage}: must be a positive number of seconds")
        return self

    def target(self, stage: str) -> float:
        return float(self.targets.get(stage, DEFAULT_TARGETS[stage]))  # type: ignore[call-overload]

    def real_actions(self) -> frozenset[str]:
        """Actions that run for real on this drill's incidents (everything else is journaled as dry_run)."""
        return frozenset(ALWAYS_REAL) | frozenset(self.real)

    def stages(self, acts_by: str = "drain") -> tuple[str, ...]:
        """The stages of this drill, whose fault is mitigated by `acts_by` (the job's only behind a drain)."""
        jobs = JOB_STAGES if self.job is not None and acts_by == "drain" else ()
        return ("detected", "decided", ACTION_STAGE[acts_by], *jobs, "undo_done")


def drill_dry_run(detail: dict, action: str, real: frozenset[str] | None) -> bool:
    """Whether a step of an incident stays dry-run: a drill's incident acts for real only with the plan's real
    actions; one restored without its drill (the agent restarted mid-drill) with the scheduler's only."""
    if not detail.get("drill"):
        return False
    return action not in (real if real is not None else frozenset(ALWAYS_REAL) | frozenset(SCHEDULER_ACTIONS))


def drill_mark(detail: dict) -> dict:
    """`{"drill": True}` for the rows of a drill's incident, so the journal says which rows a drill wrote."""
    return {"drill": True} if detail.get("drill") else {}


def parse_plan(data: object, source: str = "plan") -> DrillPlan:
    """A validated plan from parsed YAML/JSON; PlanError naming `source` and the field otherwise."""
    if not isinstance(data, dict):
        raise PlanError(f"{source}: expected a mapping with name, scenario, nodes")
    try:
        return DrillPlan.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "literal[")))
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {where}: {msg}" if where else f"{source}: {msg}")
        raise PlanError("\n".join(lines)) from None


def load_plan(path: Path | str) -> DrillPlan:
    """The plan file, validated."""
    try:
        data = load_yaml_file(path, "drill plan")
    except InputError as exc:
        raise PlanError(str(exc)) from None
    return parse_plan(data, str(path))


def check_against_inventory(plan: DrillPlan, rack: Rack) -> None:
    """The plan's nodes exist, and the fault it fakes acts only on them (PlanError naming the field)."""
    unknown = [n for n in plan.nodes if rack.nodes and n not in rack.nodes]
    if unknown:
        raise PlanError(f"nodes: {', '.join(unknown)} not in this rack's inventory")
    try:
        acts = acted_on(plan.scenario, rack)
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    outside = [n for n in acts if n not in plan.nodes]
    if outside:
        raise PlanError(f"nodes: a {describe(plan.scenario)} acts on {', '.join(acts)}; "
                        f"{', '.join(outside)} not in the plan's nodes")
