"""Playbooks: YAML declarations of a trigger, steps (with what each waits for) and undo on resolve.

Steps start at once, in the order listed (list them in physical urgency: drain before a power
cap, so the leak response never waits behind a GPU driver); a step that must follow another
says so with `after: [id]` (only earlier steps, so there is no cycle). `required: false` marks
a step whose failure does not make the response fail (a notification).

Why YAML and not code: operators read and change responses without a
release; the schema is strict (unknown keys refused with the file and the
path of the field) and actions, target kinds and approval keys are closed
sets, so a typo cannot silently disable a response.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from exporters.safe_yaml import InputError, load_yaml_file
from exporters.validation import error_lines

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "playbooks"
MODES = ("observe", "dry-run", "enforce")

TargetKind = Literal["gpus", "rack_gpus", "nodes", "port", "valve", "rack_valve", "outlets", "leaking_trays",
                     "trays_below", "none"]
ActionName = Literal["gpu_power_cap", "drain", "isolate_link", "cdu_write", "pdu_outlet", "tray_power", "notify",
                     "exec", "job_notify", "gpu_reset", "node_reboot"]
ApprovalKey = Literal["pdu_outlet_off", "cdu_write_valve", "tray_power_off", "resume_after_leak", "resume_after_check",
                      "gpu_reset", "node_reboot", "leak_watch_below", "rack_valve_close", "leak_loop_isolate", "always"]


class PlaybookError(Exception):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Trigger(_Strict):
    detector: str | None = Field(default=None, description="Local detector name.")
    alertname: str | None = Field(default=None, description="Alertmanager alertname.")
    match: dict[str, str] = Field(default_factory=dict, description="Incident targets/labels that must equal these.")

    def matches(self, detector: str, targets: dict[str, str]) -> bool:
        if detector not in (self.detector, self.alertname):
            return False
        return all(targets.get(k) == v for k, v in self.match.items())


class Step(_Strict):
    id: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_-]*$", description="Name other steps' `after` use.")
    after: list[str] = Field(default_factory=list, description="Ids of earlier steps this one waits for.")
    required: bool = Field(default=True, description="Its effect must be read back for the incident to be mitigated.")
    undo_after: list[str] = Field(default_factory=list, description=(
        "Ids of steps whose undo must finish before this one's (undo otherwise runs in reverse list order)."))
    action: ActionName
    targets: TargetKind = "none"
    params: dict[str, Any] = Field(default_factory=dict)
    approval: ApprovalKey | None = Field(default=None, description="Needs a person's approval unless automatic.")
    undo: bool = Field(default=True, description="Undo this step when the incident resolves.")
    undo_approval: ApprovalKey | None = Field(default=None, description="Undo needs approval (resume after a leak).")
    resume_check: bool = Field(default=False, description=(
        "Undo (resume) only after remediation.resume_health_check passes, else a person approves."))

    @model_validator(mode="after")
    def _derate_params(self) -> "Step":
        """A cap by thermal margin's parameters are checked at load (names and ranges), not at the first incident."""
        if self.action == "gpu_power_cap" and self.params.get("mode") == "thermal_margin":
            from .actions import ActionError
            from .actions.margin_cap import check_params

            try:
                check_params(self.params)
            except ActionError as exc:
                raise ValueError(f"params: {exc}") from None
        return self


class Playbook(_Strict):
    name: str
    description: str = ""
    trigger: Trigger
    mode: Literal["observe", "dry-run", "enforce"] | None = Field(default=None, description="Stricter than global only.")
    steps: list[Step] = Field(min_length=1)
    undo_on_resolve: bool = True
    leak_scope: Literal["tray", "zone", "rack", "loop"] | None = Field(default=None, description=(
        "A leak response of this scope (leak_scope.py): none of its steps is undone until every detector of the "
        "scope has read dry for remediation.leak_scope.dry_hold_seconds and a person approves (leak_resume.py)."))

    @model_validator(mode="after")
    def _after_names_earlier_steps(self) -> "Playbook":
        seen: set[str] = set()
        for i, step in enumerate(self.steps):
            for dep in step.after:
                if dep not in seen:
                    raise ValueError(f"steps.{i}.after: {dep!r} is not the id of an earlier step")
            if step.id is not None:
                if step.id in seen:
                    raise ValueError(f"steps.{i}.id: {step.id!r} used twice")
                seen.add(step.id)
        for i, step in enumerate(self.steps):
            for dep in step.undo_after:
                if dep not in seen or dep == step.id:
                    raise ValueError(f"steps.{i}.undo_after: {dep!r} is not the id of another step")
        self.undo_sequence()  # raises on a cycle
        return self

    def undo_sequence(self) -> list[int]:
        """Step indices in undo order: reverse list order, each step moved after its `undo_after` steps."""
        ids = {s.id: i for i, s in enumerate(self.steps) if s.id}
        todo, done = list(reversed(range(len(self.steps)))), []
        while todo:
            ready = next((i for i in todo if all(ids[d] in done for d in self.steps[i].undo_after)), None)
            if ready is None:
                raise ValueError(f"undo_after: a cycle among steps {todo}")
            todo.remove(ready)
            done.append(ready)
        return done

    def effective_mode(self, global_mode: str) -> str:
        if self.mode is None:
            return global_mode
        return MODES[min(MODES.index(global_mode), MODES.index(self.mode))]


def load_playbooks(directory: Path | None = None) -> list[Playbook]:
    directory = Path(directory or SHIPPED_DIR)
    if not directory.is_dir():
        raise PlaybookError(f"{directory}: not a directory of playbooks")
    paths = sorted(directory.glob("*.yaml"))
    if not paths:  # an empty directory would silently switch every playbook off
        raise PlaybookError(f"{directory}: no playbooks (*.yaml) in it")
    books: list[Playbook] = []
    for path in paths:
        try:
            data = load_yaml_file(path, "playbook")
        except InputError as exc:
            raise PlaybookError(str(exc)) from None
        try:
            books.append(Playbook.model_validate(data))
        except ValidationError as err:
            raise PlaybookError(error_lines(err, f"{path}: invalid playbook")) from None
    names = [b.name for b in books]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise PlaybookError(f"{directory}: playbook names appear twice: {sorted(dup)}")
    return books


def find_playbook(books: list[Playbook], detector: str, targets: dict[str, str]) -> Playbook | None:
    for book in books:
        if book.trigger.matches(detector, targets):
            return book
    return None
