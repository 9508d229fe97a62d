"""Runbooks an on-call can follow, and no invented commands anywhere in the docs.

Every alert of alerts/*.yml has docs/runbooks/<alert>.md with the five sections an
on-call needs; its PromQL parses with the real promtool. Every `supernode-agent ...`
and `supernode-sim ...` command that a runbook, README.md, docs/ or examples/ shows is
resolved against that program's own parser and its `--help` is run, so a command that
does not exist fails here.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import yaml

from agent.cli import build_parser
from sim.cli import build_parser as build_sim_parser
from tests.helpers import REPO, require_binary

RUNBOOKS = REPO / "docs" / "runbooks"
SECTIONS = ("What it means", "How to confirm", "What the agent already did", "How to undo or resume",
            "When and whom to escalate")
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "examples").rglob("*.y*ml"))]
# A command starts a code line (after `$ ` or VAR=value words) or an inline code span; in a YAML comment,
# it follows "with: " or a backtick.
_CMD = (r"(?:\$ )?(?:[A-Z_]+=\S+ )*(?:/opt/supernode-agent/bin/)?(supernode-agent|supernode-sim)\b(?![.-])"
        r"((?:[ \t]+[^\s`|#]+)*)")
_START = re.compile(r"(?:^|`)" + _CMD)
_START_YAML = re.compile(r"(?:with: |`)" + _CMD)
# program -> (its parser, the module `python -m` runs, its options that take a value before the command)
PROGRAMS = {"supernode-agent": (build_parser, "agent.cli", {"--config", "--log-level"}),
            "supernode-sim": (build_sim_parser, "sim.cli", {"--sim"})}


def _alerts() -> list[str]:
    names = []
    for path in sorted((REPO / "alerts").glob("*.yml")):
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            names += [r["alert"] for r in group["rules"] if "alert" in r]
    return names


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def test_every_alert_has_a_runbook_with_every_section():
    alerts = _alerts()
    assert len(alerts) >= 20
    for alert in alerts:
        path = RUNBOOKS / f"{alert}.md"
        assert path.exists(), f"no runbook for {alert}"
        text = path.read_text()
        assert text.startswith(f"# {alert}\n"), path.name
        sections = _sections(text)
        for name in SECTIONS:
            assert sections.get(name), f"{path.name}: section {name!r} missing or empty"
        assert "```" in sections["How to confirm"], f"{path.name}: no command or query to confirm with"
        assert re.search(r"\b(at once|now|minutes|hour|shift|day)\b", sections["When and whom to escalate"], re.I), \
            f"{path.name}: escalation says no when"


def test_no_runbook_without_an_alert():
    assert {p.stem for p in RUNBOOKS.glob("*.md")} <= set(_alerts())


def _promql_blocks() -> list[tuple[str, str]]:
    out = []
    for path in sorted(RUNBOOKS.glob("*.md")):
        for block in re.findall(r"```promql\n(.*?)```", path.read_text(), flags=re.S):
            out += [(path.name, line.split("   #")[0].strip()) for line in block.splitlines() if line.strip()]
    return out


def test_runbook_queries_parse_with_promtool(tmp_path):
    promtool = require_binary("promtool")
    queries = _promql_blocks()
    assert len(queries) >= 21
    rules = [{"record": f"runbook:q{i}:x", "expr": q} for i, (_, q) in enumerate(queries)]
    path = tmp_path / "runbook-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "runbooks", "rules": rules}]}))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules)} rules found" in res.stdout


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_path(words: list[str], program: str = "supernode-agent") -> list[str]:
    """The subcommand path of `PROGRAM WORDS`; raises ValueError naming a word the CLI does not know."""
    words = [w for w in words if not (w.startswith("[") or w.endswith("]"))]  # optional [--config F] in usage text
    # `supernode-agent probe snmp: <kind>` quotes an error message: the command ends at the colon.
    ends = next((i for i, w in enumerate(words) if w.endswith(":")), None)
    if ends is not None:
        words = words[:ends] + [words[ends].rstrip(":")]
    build, _, global_options = PROGRAMS[program]
    parser, path, i = build(), [], 0
    while i < len(words):
        word = words[i]
        if word in global_options and not path:
            i += 2
            continue
        choices = _subparsers(parser)
        if not choices:
            break
        if word not in choices:
            raise ValueError(f"`{program} {' '.join(path + [word])}`: no such command "
                             f"(known: {', '.join(sorted(choices))})")
        parser, path, i = choices[word], path + [word], i + 1
    return path


def documented_commands() -> dict[tuple[str, ...], str]:
    """Each distinct (program, *subcommand path) the docs name, with one place that names it."""
    found: dict[tuple[str, ...], str] = {}
    for doc in DOCS:
        pattern = _START if doc.suffix == ".md" else _START_YAML
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for m in pattern.finditer(line):
                try:
                    path = command_path(m.group(2).split(), m.group(1))
                except ValueError as exc:
                    raise AssertionError(f"{doc.relative_to(REPO)}:{n}: {exc}") from None
                if path:
                    found.setdefault((m.group(1), *path), f"{doc.relative_to(REPO)}:{n}")
    return found


def test_command_path_rejects_invented_commands():
    assert command_path(["--config", "F", "approve", "leak-1"]) == ["approve"]
    assert command_path(["probe", "snmp:", "timeout:"]) == ["probe", "snmp"]
    assert command_path(["--sim", "URL", "inject", "leak"], "supernode-sim") == ["inject"]
    invented = [("supernode-agent", ["approvals", "list"]), ("supernode-agent", ["status"]),
                ("supernode-sim", ["reset"]),
                # the simulator's commands are its own program's, no longer the agent's
                ("supernode-agent", ["sim", "inject", "leak"]), ("supernode-agent", ["demo"])]
    for program, words in invented:
        try:
            command_path(words, program)
        except ValueError as exc:
            assert words[-1] in str(exc) or words[0] in str(exc)
        else:
            raise AssertionError(f"{program} {words} accepted")


def test_every_documented_command_exists_and_answers_help():
    commands = documented_commands()
    # The commands an on-call is told to run are among them.
    agent = "supernode-agent"
    assert {(agent, "incidents"), (agent, "approve"), (agent, "journal"), (agent, "check-config")} <= set(commands)
    # ...and README's tour of the simulated rack.
    assert {("supernode-sim", "demo"), ("supernode-sim", "inject"), ("supernode-sim", "clear")} <= set(commands)
    for (program, *path), where in sorted(commands.items()):
        res = subprocess.run([sys.executable, "-m", PROGRAMS[program][1], *path, "--help"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and res.stdout.startswith(f"usage: {program}"), \
            f"{where}: `{program} {' '.join(path)} --help` failed: {res.stderr}"
