"""NVIDIA's XID catalogue as data: generated from the committed copy of the published page, loaded typed.

Why generated and not hand-written: the catalogue's judgement (immediate and investigatory action per XID and
architecture) is NVIDIA's, so the YAML the agent reads is made by this module from the committed source copy
(exporters/profiles/nvml/source/, provenance in its README.md) and a test regenerates it and compares: a hand
edit, or a source update without regenerating, fails. Nothing here decides what the agent does about an XID;
that is the remediation ladder's job, which reads `load_catalogue()`.

    python -m exporters.gpu.xid_catalogue --write    # regenerate exporters/profiles/nvml/xid-catalogue.yaml
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from exporters.errors import ProfileError
from exporters.gpu.xid_actions import DEFAULT_CATALOGUE as CATALOGUE_FILE
from exporters.safe_yaml import InputError, load_yaml_file, read_text_file
from exporters.validation import error_lines

NVML_PROFILES = Path(__file__).resolve().parent.parent / "profiles" / "nvml"
SOURCE_DIR = NVML_PROFILES / "source"
XIDS_SHEET = SOURCE_DIR / "xid-catalog-xids-sheet.txt"
GUIDANCE_SHEET = SOURCE_DIR / "xid-catalog-guidance-classes.txt"
DEFAULT_CATALOGUE = CATALOGUE_FILE  # the one path, shared with the NVML source's pydantic-free reader

# What the generated file says of its source; the copy itself is undated (README.md says how it was obtained).
SOURCE = ("NVIDIA Xid Catalog, https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html "
          "(undated page; newest driver it names: R575 / CUDA 12.9; copy taken 2026-12-03)")
ARCHITECTURES = ("A100", "H100", "B100", "GB200")  # the page's "Applies to" columns, in its order
MAX_SOURCE_BYTES = 1 << 20
# A cell of the "Xid 154 linkage" column: the driver/CUDA release that links the code to Xid 154, or "yes; ...".
_LINKAGE = re.compile(r"^(CUDA \d+\.\d+; GPU driver R\d+|yes; .+)$")
# A resolution bucket is an upper-case token (CHECK_APP/CUDA included); free-text cells are trigger conditions.
_BUCKET = re.compile(r"^[A-Z][A-Z0-9_/]*[A-Z0-9]$")


class XidEntry(BaseModel):
    """One XID as the catalogue publishes it (actions are its "Resolution Bucket" vocabulary, verbatim)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: int = Field(ge=0)
    mnemonic: str = Field(min_length=1)
    description: str = Field(min_length=1)
    architectures: tuple[str, ...] = Field(min_length=1)
    immediate_action: str | None = Field(description="None where the catalogue publishes no bucket for the code.")
    investigatory_action: str | None
    xid154_linkage: str | None = None
    trigger: str | None = None
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _known_architectures(self) -> XidEntry:
        unknown = [a for a in self.architectures if a not in ARCHITECTURES]
        if unknown:
            raise ValueError(f"architectures: {unknown} not among {', '.join(ARCHITECTURES)}")
        return self


class XidCatalogue(BaseModel):
    """The generated file: the guidance classes (the action vocabulary with NVIDIA's text) and the entries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(min_length=1)
    guidance_classes: dict[str, str] = Field(min_length=1)
    xids: list[XidEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _actions_in_vocabulary(self) -> XidCatalogue:
        seen: set[int] = set()
        for i, entry in enumerate(self.xids):
            if entry.code in seen:
                raise ValueError(f"xids.{i}.code: XID {entry.code} listed twice")
            seen.add(entry.code)
            for field in ("immediate_action", "investigatory_action"):
                action = getattr(entry, field)
                if action is not None and action not in self.guidance_classes:
                    raise ValueError(f"xids.{i}.{field}: {action!r} is not a guidance class of the catalogue")
        return self

    def immediate_actions(self) -> set[str]:
        """The immediate actions the catalogue uses: what an operator override may choose from."""
        return {e.immediate_action for e in self.xids if e.immediate_action is not None}


# ---- generating from the committed source copy ------------------------------------------------------------

def _cells(text: str) -> list[str]:
    """The page's flattened table as cells: each published cell ends in ' |' at a line end; a bare '|' (or a run
    of them) is an empty cell, which the rendering leaves without position, so empty cells are dropped."""
    out: list[str] = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line or set(line) <= {"|"}:
            continue
        if line.endswith(" |"):
            line = line[:-2]
        out.append(line.strip())
    return out


def _table(text: str, header_end: str) -> list[str]:
    """The cells after the table's |---| separator line."""
    marker = text.find(header_end)
    if marker < 0:
        raise ProfileError(f"source: the table separator {header_end!r} is missing")
    return _cells(text[marker + len(header_end):])


def parse_xids_sheet(text: str) -> list[dict[str, Any]]:
    """Every XID row the catalogue marks as raised by at least one of A100, H100, B100, GB200."""
    cells = _table(text, "|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows: list[list[str]] = []
    for cell in cells:
        if cell == "XID":
            rows.append([])
        elif not rows:
            raise ProfileError(f"source: a cell {cell[:40]!r} before the first XID row")
        else:
            rows[-1].append(cell)
    out = []
    for row in rows:
        if len(row) < 7 or not row[0].isdigit():
            raise ProfileError(f"source: a malformed XID row {row[:3]!r}")
        code, mnemonic, description, applies, rest = int(row[0]), row[1], row[2], row[3:7], row[7:]
        if any(a not in ("YES", "NO") for a in applies):
            raise ProfileError(f"source: XID {code}: applies-to cells {applies!r} are not YES/NO")
        archs = [arch for arch, yes in zip(ARCHITECTURES, applies, strict=True) if yes == "YES"]
        if not archs:
            continue  # not raised by Ampere, Hopper or Blackwell: the catalogue's "Unused"
        immediate = investigatory = None
        if rest and _BUCKET.match(rest[0]):
            immediate, rest = rest[0], rest[1:]
            if rest and not _LINKAGE.match(rest[0]):
                investigatory, rest = rest[0], rest[1:]
        linkage = rest.pop(0) if rest and _LINKAGE.match(rest[0]) else None
        if len(rest) > 1:
            raise ProfileError(f"source: XID {code}: cells left over {rest!r}")
        out.append({"code": code, "mnemonic": mnemonic, "description": description, "architectures": archs,
                    "immediate_action": immediate, "investigatory_action": investigatory,
                    "xid154_linkage": linkage, "trigger": rest[0] if rest else None, "source": SOURCE})
    return out


def parse_guidance_sheet(text: str) -> dict[str, str]:
    """Guidance class -> NVIDIA's resolution text; a class listed twice must say the same both times."""
    cells = _table(text, "|---|---|")
    if len(cells) % 2:
        raise ProfileError("source: the guidance class table has an odd number of cells")
    out: dict[str, str] = {}
    for name, action in zip(cells[::2], cells[1::2], strict=True):
        if out.get(name, action) != action:
            raise ProfileError(f"source: guidance class {name!r} listed twice with different text")
        out[name] = action
    return out


def generate(xids_sheet: Path = XIDS_SHEET, guidance_sheet: Path = GUIDANCE_SHEET) -> str:
    """The YAML text of the catalogue, made from the committed source copy (deterministic: same input, same bytes)."""
    try:
        xids = parse_xids_sheet(read_text_file(xids_sheet, MAX_SOURCE_BYTES, "catalogue source"))
        guidance = parse_guidance_sheet(read_text_file(guidance_sheet, MAX_SOURCE_BYTES, "catalogue source"))
    except InputError as exc:
        raise ProfileError(str(exc)) from None
    data = {"source": SOURCE, "guidance_classes": guidance, "xids": xids}
    _validated(data, "generated catalogue")  # the generator never writes what the loader would refuse
    header = ("# GENERATED by `python -m exporters.gpu.xid_catalogue --write` from exporters/profiles/nvml/source/\n"
              "# (NVIDIA's published Xid Catalog; provenance in source/README.md). Do not edit: override single\n"
              "# entries in the agent config (remediation.xid_overrides).\n")
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


# ---- loading ---------------------------------------------------------------------------------------------

def _validated(raw: Any, what: str) -> XidCatalogue:
    try:
        return XidCatalogue.model_validate(raw)
    except ValidationError as err:
        raise ProfileError(error_lines(err, f"{what}: invalid")) from None


def load_catalogue_file(path: Path = DEFAULT_CATALOGUE) -> XidCatalogue:
    """The whole generated file, validated; ProfileError names the file and the field."""
    try:
        raw = load_yaml_file(path, "XID catalogue")
    except InputError as exc:
        raise ProfileError(str(exc)) from None
    return _validated(raw, str(path))


def load_catalogue(path: Path = DEFAULT_CATALOGUE) -> dict[int, XidEntry]:
    """XID code -> its catalogue entry."""
    return {e.code: e for e in load_catalogue_file(path).xids}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporters.gpu.xid_catalogue", description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {DEFAULT_CATALOGUE.name} (else print it)")
    args = parser.parse_args(argv)
    text = generate()
    if args.write:
        DEFAULT_CATALOGUE.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
