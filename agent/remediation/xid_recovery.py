"""The recovery ladder's data: catalogue action -> ladder class, and the rules over time and scope, loaded typed.

Why data and not code: which class an XID lands in is a judgement (ours, read from NVIDIA's catalogue, its
Health Validation checks and NVSentinel's rules: the provenance is in the YAML), reviewed and changed like a
profile, while the judge (gpu_faults.py) only applies it. Everything is checked at load: a class outside the
ladder, a repeat rule without a window, a typo in a key fails with the file and the field named.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from exporters.errors import ProfileError
from exporters.gpu.xid_catalogue import NVML_PROFILES, XidCatalogue, XidEntry, load_catalogue_file
from exporters.safe_yaml import InputError, load_yaml_file
from exporters.validation import error_lines

DEFAULT_RULES = NVML_PROFILES / "xid-recovery.yaml"

# The ladder, least disruptive first; `ignore` is below it (counted and shown, nothing done).
LADDER = ("app", "reset", "reboot", "service")
Klass = Literal["app", "reset", "reboot", "service", "ignore"]
RANK = {"ignore": 0, "app": 1, "reset": 2, "reboot": 3, "service": 4}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Mapping_(_Strict):
    klass: Klass = Field(alias="class")
    why: str = Field(min_length=1)


class ImmediateMapping(_Strict):
    klass: Literal["app", "reset", "reboot", "service", "ignore", "driver"] = Field(alias="class")
    why: str = Field(min_length=1)


class RepeatRule(_Strict):
    name: str = Field(min_length=1)
    xids: list[int] = Field(min_length=1)
    count: int = Field(ge=2)
    window_seconds: float = Field(gt=0)
    escalate_to: Literal["reset", "reboot", "service"]
    why: str = Field(min_length=1)


class SpreadRule(_Strict):
    name: str = Field(min_length=1)
    min_gpus: int = Field(ge=2)
    window_seconds: float = Field(gt=0)
    why: str = Field(min_length=1)


class RowRemap(_Strict):
    pending: Mapping_
    failure: Mapping_


class RecoveryRules(_Strict):
    immediate_actions: dict[str, ImmediateMapping] = Field(min_length=1)
    no_bucket: dict[int, Mapping_] = Field(default_factory=dict)
    unknown_xid: Mapping_
    recovery_actions: dict[str, Mapping_] = Field(min_length=1)
    row_remap: RowRemap
    repeats: list[RepeatRule] = Field(default_factory=list)
    spread: SpreadRule
    max_events_per_gpu: int = Field(ge=8, le=100_000)

    @model_validator(mode="after")
    def _consistent(self) -> RecoveryRules:
        if "none" in self.recovery_actions:
            raise ValueError("recovery_actions.none: `none` is no verdict and takes no class")
        names = [r.name for r in self.repeats]
        if len(set(names)) != len(names) or self.spread.name in names:
            raise ValueError("repeats: rule names must be unique (and differ from spread.name)")
        return self

    @property
    def longest_window(self) -> float:
        return max([r.window_seconds for r in self.repeats] + [self.spread.window_seconds])

    def class_of(self, entry: XidEntry | None, action: str | None) -> tuple[str, str]:
        """(class, why) of one XID: its immediate action (after overrides) or, without one, its own entry here.

        `driver` comes back as is: the judge resolves it against the driver's recovery action."""
        if entry is None:
            return self.unknown_xid.klass, self.unknown_xid.why
        if action is None:
            m = self.no_bucket.get(entry.code)
            return (m.klass, m.why) if m else ("ignore", "the catalogue publishes no action for it")
        imm = self.immediate_actions.get(action)
        if imm is None:  # only reachable if the catalogue and this file disagree; the tests keep them in step
            return self.unknown_xid.klass, f"immediate action {action} has no class in {DEFAULT_RULES.name}"
        return imm.klass, imm.why


def load_rules(path: Path = DEFAULT_RULES) -> RecoveryRules:
    """The file, validated; ProfileError names the file and the field."""
    try:
        raw = load_yaml_file(path, "XID recovery rules")
    except InputError as exc:
        raise ProfileError(str(exc)) from None
    try:
        return RecoveryRules.model_validate(raw)
    except ValidationError as err:
        raise ProfileError(error_lines(err, f"{path}: invalid")) from None


@functools.cache
def shipped_rules() -> tuple[RecoveryRules, XidCatalogue]:
    """The shipped rules and catalogue, read once per process (every detector table shares them; both frozen)."""
    return load_rules(), load_catalogue_file()


def xid_class(code: int) -> str:
    """The ladder class one XID asks for by itself (shipped catalogue and rules, no overrides, no history): for a
    display that has no judge at hand. `driver` (XID 154) stays as is: the driver's verdict decides."""
    rules, catalogue = shipped_rules()
    entry = next((e for e in catalogue.xids if e.code == code), None)
    return rules.class_of(entry, entry.immediate_action if entry else None)[0]
