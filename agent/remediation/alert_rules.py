"""Renders alerts/supernode.rules.yml from its template and the detectors' default thresholds.

Why: each detector alert says it is "the same condition" as the agent's own
detector, and with the numbers written twice they drifted (thermal margin
5 vs 3 °C, NVLink errors 1/s vs 10/s, flap window 15 min vs 300 s). The
template names every threshold by its `DetectorSettings` field, e.g.
`<<gpu_thermal_margin_celsius>>` (a dotted path reaches a nested field), and
this module fills in the defaults; a test fails when the committed rules
differ from a fresh render. Rendering is plain text substitution, so the
template's comments and layout survive and Go templates (`{{ $value }}`) are
left alone.

    python -m agent.remediation.alert_rules          # rewrite the rules file
    python -m agent.remediation.alert_rules --check  # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from .settings import DetectorSettings

ALERTS_DIR = Path(__file__).resolve().parents[2] / "alerts"
TEMPLATE = ALERTS_DIR / "supernode.rules.yml.in"
OUTPUT = ALERTS_DIR / "supernode.rules.yml"
PLACEHOLDER = re.compile(r"<<([a-z_][a-z0-9_.]*)>>")
HEADER = "# GENERATED from supernode.rules.yml.in by `python -m agent.remediation.alert_rules`: edit the template.\n"


class TemplateError(ValueError):
    """A placeholder names no detector setting (the message names it and its line)."""


def _format(value: Any) -> str:
    """PromQL-ready text: numbers without trailing zeros, lists as a regex alternation (XIDs, error types)."""
    if isinstance(value, bool):
        raise TypeError("a boolean is not a threshold")
    if isinstance(value, (list, tuple)):
        return "|".join(_format(v) for v in value)
    if isinstance(value, float):
        return format(value, "g")
    return str(value)


def lookup(settings: DetectorSettings, path: str) -> Any:
    value: Any = settings
    for part in path.split("."):
        if not hasattr(value, part):
            raise TemplateError(f"<<{path}>>: DetectorSettings has no field {part!r}")
        value = getattr(value, part)
    return value


def placeholders(text: str) -> set[str]:
    """The setting paths a template uses."""
    return set(PLACEHOLDER.findall(text))


def render(template: str, settings: DetectorSettings | None = None) -> str:
    s = settings or DetectorSettings()
    out = []
    for n, line in enumerate(template.splitlines(keepends=True), 1):
        try:
            out.append(PLACEHOLDER.sub(lambda m: _format(lookup(s, m.group(1))), line))
        except TemplateError as exc:
            raise TemplateError(f"{TEMPLATE.name}:{n}: {exc}") from None
    return HEADER + "".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])  # no docstring under python -OO
    p.add_argument("--check", action="store_true", help="exit 1 when the rules file differs from a fresh render")
    args = p.parse_args(argv)
    text = render(TEMPLATE.read_text())
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python -m agent.remediation.alert_rules", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
