"""The goodput report's renderings: the text section under `report`'s reliability table, Markdown (the contract
view), CSV (one row per node or rack and cause, for a spreadsheet). JSON is the report's dict itself.

Why apart from agent/goodput.py: that module decides the figures; this one only prints them, and prints an
unknown figure (no journal covered the node, no GPU count) as unknown, never as 0 or 100 %.
"""

from __future__ import annotations

import csv
import io
import time
from typing import Any

from .goodput import CAUSES
from .reliability import _columns, human_seconds

CSV_FIELDS = ("scope", "name", "cause", "events", "out_of_service_seconds", "gpu_hours_lost", "availability",
              "mtbf_seconds", "mttr_seconds", "repairs")


def pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.3f} %"


def hours(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2f}"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _jobs(inc: dict[str, Any]) -> str:
    return "not recorded" if inc["jobs"] is None else (", ".join(inc["jobs"]) or "none")


def _tables(g: dict[str, Any]) -> list[tuple[str, list[list[str]]]]:
    """The report's tables as (title, rows), the first row the header: text and Markdown print the same."""
    r = g["rack"]
    rack = [["NODES", "OBSERVED", "OUT OF SERVICE", "AVAILABILITY", "GPU-HOURS LOST"],
            [f"{r['nodes_observed']} of {r['nodes']}", human_seconds(r["observed_seconds"]),
             human_seconds(r["out_of_service_seconds"]), pct(r["availability"]), hours(r["gpu_hours_lost"])]]
    nodes = [["NODE", "OBSERVED", "OUT OF SERVICE", "DRAINED", "REBOOTING", "MAINTENANCE", "AVAILABILITY",
              "GPU-HOURS LOST"]]
    for name, n in g["nodes"].items():
        if n["availability"] is None:
            nodes.append([name, "no journal", "unknown", "-", "-", "-", "unknown", "unknown"])
            continue
        st = n["by_state"]
        nodes.append([name, human_seconds(n["observed_seconds"]), human_seconds(n["out_of_service_seconds"]),
                      human_seconds(st["drained"]), human_seconds(st["rebooting"]), human_seconds(st["maintenance"]),
                      pct(n["availability"]), hours(n["gpu_hours_lost"])])
    causes = [["CAUSE", "EVENTS", "OUT OF SERVICE", "GPU-HOURS LOST", "MTBF", "MTTR", "REPAIRS"]]
    for c in CAUSES:
        s = r["by_cause"][c]
        if s["events"] or s["out_of_service_seconds"]:
            causes.append([c, str(s["events"]), human_seconds(s["out_of_service_seconds"]), hours(s["gpu_hours_lost"]),
                           human_seconds(s["mtbf_seconds"]), human_seconds(s["mttr_seconds"]), str(s["repairs"])])
    incidents = [["INCIDENT", "CAUSE", "DETECTOR", "NODES", "JOBS INTERRUPTED", "JOBS"]]
    for inc in g["incidents"]:
        n = inc["jobs_interrupted"]
        incidents.append([inc["incident_id"], inc["cause"] or "?", inc["detector"] or "?", ",".join(inc["nodes"]) or "-",
                          "unknown" if n is None else str(n), _jobs(inc)])
    return [("rack", rack), ("per node", nodes), ("by cause (the rack)", causes),
            ("incidents that took a node out or requeued its jobs", incidents)]


def _title(g: dict[str, Any]) -> str:
    return (f"goodput from {_when(g['since'])} to {_when(g['until'])}"
            f" ({'?' if g['gpus_per_node'] is None else g['gpus_per_node']} GPUs per node)")


def format_text(g: dict[str, Any]) -> str:
    lines = ["", _title(g) + ":"]
    for title, rows in _tables(g):
        lines += ["", title + ":"] + (_columns(rows) if len(rows) > 1 else ["none"])
    return "\n".join(lines) + "\n"


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def format_markdown(g: dict[str, Any], reliability: dict[str, Any], node: str, rack: str) -> str:
    """The contract view: goodput first (what the customer pays for), then MTBF/MTTR per component class."""
    lines = [f"# Goodput of rack {rack}", "", _title(g) + ".", ""]
    for title, rows in _tables(g):
        lines += [f"## {title[0].upper()}{title[1:]}", ""]
        if len(rows) == 1:
            lines += ["none", ""]
            continue
        lines += [_md_row(rows[0]), _md_row(["---"] * len(rows[0]))] + [_md_row(r) for r in rows[1:]] + [""]
    lines += [f"## Component reliability seen by {node}", "",
              _md_row(["class", "components", "failures", "MTBF", "MTTR", "repairs"]), _md_row(["---"] * 6)]
    for c in reliability["classes"]:
        lines.append(_md_row([c["class"], "?" if c["components"] is None else str(c["components"]), str(c["failures"]),
                              human_seconds(c["mtbf_seconds"]), human_seconds(c["mttr_seconds"]), str(c["repairs"])]))
    return "\n".join(lines) + "\n"


def format_csv(g: dict[str, Any]) -> str:
    """One row per (scope, name, cause), cause `all` for a node's or the rack's totals; unknown is empty."""
    out = io.StringIO()
    writer = csv.writer(out)

    def row(cells: list[Any]) -> None:
        writer.writerow(["" if c is None else c for c in cells])
    row(list(CSV_FIELDS))
    r = g["rack"]
    row(["rack", "rack", "all", "", r["out_of_service_seconds"], r["gpu_hours_lost"], r["availability"],
                "", "", ""])
    for c in CAUSES:
        s = r["by_cause"][c]
        row(["rack", "rack", c, s["events"], s["out_of_service_seconds"], s["gpu_hours_lost"], "",
                    s["mtbf_seconds"], s["mttr_seconds"], s["repairs"]])
    for name, n in g["nodes"].items():
        row(["node", name, "all", "", n["out_of_service_seconds"], n["gpu_hours_lost"], n["availability"],
                    "", "", ""])
        for c, s in n["by_cause"].items():
            row(["node", name, c, s["events"], s["out_of_service_seconds"], s["gpu_hours_lost"], "",
                        s["mtbf_seconds"], s["mttr_seconds"], s["repairs"]])
    return out.getvalue()
