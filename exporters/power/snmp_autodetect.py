"""`profile: auto`: pick a PDU's SNMP profile from what the device says it is (sysObjectID, sysDescr).

The rules are data (exporters/profiles/snmp-auto.yaml), like every other
piece of device knowledge; this module validates them at load and applies
them. The choice comes with a sentence saying why, so `probe snmp
--profile auto` and the agent's log can show which rule matched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from exporters.model import SourceError
from exporters.safe_yaml import load_yaml_file
from exporters.snmp.client import SnmpClient
from exporters.snmp.profile import PROFILE_DIR, ProfileError, available_profiles, check_oid
from exporters.validation import error_lines

AUTO = "auto"
RULES_FILE = PROFILE_DIR.parent / "snmp-auto.yaml"
SYS_DESCR, SYS_OBJECT_ID = "1.3.6.1.2.1.1.1.0", "1.3.6.1.2.1.1.2.0"


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prefix: str = Field(description="sysObjectID prefix (whole arcs).")
    sysdescr: str | None = Field(default=None, description="Regular expression searched in sysDescr.0.")
    profile: str
    family: str = Field(min_length=1, description="What the rule recognises, for the reason shown to the user.")

    _oid = field_validator("prefix")(classmethod(lambda cls, v: check_oid(v)))

    @field_validator("sysdescr")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return v

    @field_validator("profile")
    @classmethod
    def _shipped(cls, v: str) -> str:
        pdus = available_profiles(kind="pdu")
        if v not in pdus:
            raise ValueError(f"no PDU profile {v!r} (known: {pdus})")
        return v

    def matches(self, sys_object_id: str, sys_descr: str) -> bool:
        oid = sys_object_id.strip().lstrip(".")
        if oid != self.prefix and not oid.startswith(self.prefix + "."):
            return False
        return self.sysdescr is None or re.search(self.sysdescr, sys_descr) is not None


class Rules(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: list[Rule] = Field(min_length=1)


@dataclass(frozen=True)
class Detection:
    profile: str
    reason: str


def load_rules(path: Path = RULES_FILE) -> list[Rule]:
    """The rules in match order: longest prefix first, a sysDescr rule before the plain rule of its prefix."""
    data = load_yaml_file(path, "SNMP auto-detection rules")
    try:
        rules = Rules.model_validate(data).rules
    except ValidationError as err:
        raise ProfileError(error_lines(err, f"{path}: invalid auto-detection rules")) from None
    return sorted(rules, key=lambda r: (-len(r.prefix.split(".")), r.sysdescr is None))


def choose(sys_object_id: str, sys_descr: str, rules: list[Rule] | None = None) -> Detection:
    """The profile for a device that answered these; SourceError("decode") when no rule knows it."""
    for rule in load_rules() if rules is None else rules:
        if rule.matches(sys_object_id, sys_descr):
            why = f"sysObjectID {sys_object_id} is under {rule.prefix}"
            if rule.sysdescr is not None:
                why += f" and sysDescr matches /{rule.sysdescr}/"
            return Detection(rule.profile, f"{rule.family}: {why}")
    raise SourceError("decode", f"profile auto: no rule of {RULES_FILE.name} knows sysObjectID {sys_object_id!r} "
                                f"(sysDescr {sys_descr[:120]!r}); name the profile in the inventory")


async def detect(client: SnmpClient) -> Detection:
    """GET sysObjectID.0 and sysDescr.0 and choose (timeouts and auth errors propagate as they are)."""
    got = await client.get([SYS_OBJECT_ID, SYS_DESCR])
    oid, descr = got.get(SYS_OBJECT_ID), got.get(SYS_DESCR)
    if not isinstance(oid, str) or not oid:
        raise SourceError("decode", f"{client.where}: profile auto: the device gives no sysObjectID.0 ({oid!r})")
    return choose(oid, descr if isinstance(descr, str) else "")
