"""The `drill` subcommand's arguments, apart from agent/drill/api.py.

Why a module of its own: the CLI builds every subcommand's parser before the daemon starts, and api.py imports
aiohttp.web (through agent.auth), which would load the system MIME database before agent.memory can skip it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def add_drill_parser(sub: Any) -> None:
    dr = sub.add_parser("drill", help="run a fault drill from a plan (examples/drill-leak.yaml) on the running "
                        "agent and print its report; --abort ends a running one and undoes what it did")
    dr.add_argument("plan", nargs="?", type=Path, help="the plan (YAML)")
    dr.add_argument("--abort", action="store_true", help="end the running drill now and undo what it did")
    dr.add_argument("--allow-jobs", action="store_true", help="drill even where a job not marked drill-safe runs")
    dr.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    dr.add_argument("--wait", type=float, default=1800.0, help="seconds to wait for the drill's end (default "
                    "%(default)s)")
    dr.add_argument("--url", default=None)
    dr.add_argument("--token-file", default=None)
