"""The reference GB200 tray's /metrics, counted per family: the series budget's figures (docs/metrics.md).

Why here: the count is of what a real agent serves (its whole registry: identity, sources, remediation, self
metrics, and the readings through the series budget) for the demo's tray (4 GB200 GPUs x 18 NVLinks, optics,
CDUs, leak controller, PDU, the tray's Redfish BMC, the Redfish CDU and switch tray), and only the simulator
has that tray. Frozen as the golden exposition is (no model ticks, one poll of every source, events off), so
the count is the same at every run and a test can pin it (tests/test_series_budget.py): a family that grows is
a decision, written down there and here. `python -m sim.reference_tray` rewrites the section of docs/metrics.md.

Two trays: `quiet` (nothing wrong) and `faulted` (one NVLink erroring, one transceiver below its receive-power
alarm): the cost of a fault is the detail it brings back, and it is small.
"""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from agent.catalogue import CATALOGUE, REPO, SERIES_MARK as MARK

SHARED_SOURCES = ("cdu", "leak", "pdu", "derived")  # with the Redfish CDU and switch tray: polled by <= 2 agents


async def poll_all(store: Any, loaded: Any) -> None:
    """One poll of every source of the config (derived last: rack power reads the PDUs' inlets, the leak watch
    the leak sources), published into `store`, each source closed after."""
    from agent.derived import derived_sources
    from agent.sources import build_sources

    sources = build_sources(loaded)
    sources += derived_sources(store, loaded, sources)
    for s in sources:
        store.register(s.source.name, s.source.device, s.settings.interval, 2.0)
        result = await s.source.poll()
        store.publish(s.source.name, s.source.device, result.readings, 0.0125, result.partial_errors)
        await s.source.close()


def tray_config(sim: Any, workdir: Path) -> dict[str, Any]:
    """node01's demo config, frozen: the Redfish SSE stream would open (or not yet) during the poll, a race."""
    from sim.demo import agent_config

    for name in ("admin.token", "webhook.token"):
        (workdir / name).write_text("t")
    cfg = agent_config(sim, "node01", 0, workdir, mode="observe")
    cfg["sources"]["dom"]["module_timeout"] = 2.0
    cfg["sources"]["redfish"]["events"] = "off"
    return cfg


async def tray_exposition(workdir: Path, faulted: bool = False, detail: list[str] | None = None) -> str:
    """The reference tray's whole /metrics body as its agent serves it (metrics.detail as given)."""
    from agent.config import parse_config
    from agent.daemon import Agent
    from sim.server import Simulator

    sim = Simulator(nodes=2, gpus=4, tick=3600.0, workdir=workdir / "sim", advertise=False, personality="gb200")
    await sim.start()
    try:
        cfg = tray_config(sim, workdir)
        if faulted:
            sim.inject("nvlink-errors", {"node": "node01", "gpu": 1, "link": 3, "rate": 50.0})
            sim.model.step(1.0)  # the errors counted once; the model does not tick by itself here
            port = cfg["inventory"]["ports"][0]["name"]
            sim.inject("optic-degrade", {"node": "node01", "port": port, "rx_dbm": -30.0})
        if detail:
            cfg["metrics"] = {"detail": list(detail)}
        agent = Agent(parse_config(cfg))
        await poll_all(agent.store, agent.loaded)
        return agent.render_metrics().decode()
    finally:
        await sim.stop()


def series_by_family(text: str) -> dict[str, int]:
    """Series per family of an exposition (a histogram's _bucket, _sum and _count are one family)."""
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if kinds.get(base) != "histogram":
            base = name
        counts[base] += 1
    return dict(sorted(counts.items()))


def shared_series(text: str) -> int:
    """Series of the rack's shared devices (CDUs, leak controller, PDU, Redfish CDU and switch tray): in a rack
    with coordination only their two pollers export them."""
    pattern = re.compile(r'(pdu|cdu)="|bmc="(rfcdu|bmc-switch)|source="(cdu|leak|pdu)"|'
                         r'device="(leak_sources|rack_power)"|^supernode_(rack_power|leak_detected|leak_sensor_fault'
                         r'|leak_detector_state)')
    return sum(1 for line in text.splitlines() if line and not line.startswith("#") and pattern.search(line))


async def counts() -> dict[str, Any]:
    """Per family: the quiet tray by default, the faulted tray by default, the quiet tray with every detail."""
    from agent.series_budget import DETAIL_GROUPS

    out: dict[str, Any] = {}
    for key, faulted, detail in (("quiet", False, None), ("faulted", True, None), ("detail", False, list(DETAIL_GROUPS))):
        with tempfile.TemporaryDirectory() as d:
            text = await tray_exposition(Path(d), faulted, detail)
        out[key] = series_by_family(text)
        out[key + "_shared"] = shared_series(text)
    return out


def render_section(c: dict[str, Any]) -> str:
    """The section of docs/metrics.md: the families over 8 series, the totals, the shared devices' part."""
    quiet, faulted, detail = c["quiet"], c["faulted"], c["detail"]
    names = sorted(set(quiet) | set(faulted) | set(detail),
                   key=lambda n: (-max(quiet.get(n, 0), detail.get(n, 0)), n))
    lines = [MARK, "",
             "Generated by `python -m sim.reference_tray`: the demo's GB200 tray (node01: 4 GPUs x 18 NVLinks, its ports",
             "and 4 transceivers, its Redfish BMC; and the rack's CDUs, leak controller, PDU, Redfish CDU and switch tray it",
             "polls), one poll of every source, its agent's whole `/metrics`. `quiet`: nothing wrong; `faulted`: one",
             "NVLink erroring and one transceiver below its receive-power alarm; `all detail`: `metrics.detail` with",
             "every group. tests/test_series_budget.py pins the default counts: a family that grows is a decision.",
             "Families of 8 series or fewer are summed in the last row but one. Redfish events are off for the",
             "count (whether the SSE stream is open yet during the one poll is a race): with them, each of the 3",
             "Redfish services adds its event stream's few series (up, events, errors by reason, coalesced polls).", "",
             "| family | quiet | faulted | all detail |", "| --- | ---: | ---: | ---: |"]
    small = [0, 0, 0]
    for n in names:
        row = (quiet.get(n, 0), faulted.get(n, 0), detail.get(n, 0))
        if max(row) > 8:
            lines.append(f"| `{n}` | {row[0]:,} | {row[1]:,} | {row[2]:,} |")
        else:
            small = [a + b for a, b in zip(small, row)]
    lines.append(f"| {sum(1 for n in names if max(quiet.get(n, 0), faulted.get(n, 0), detail.get(n, 0)) <= 8)} "
                 f"families of <= 8 | {small[0]:,} | {small[1]:,} | {small[2]:,} |")
    lines.append(f"| **total** | **{sum(quiet.values()):,}** | **{sum(faulted.values()):,}** "
                 f"| **{sum(detail.values()):,}** |")
    lines += ["", f"Of the quiet tray's {sum(quiet.values()):,}, {c['quiet_shared']:,} are the rack's shared devices: "
              f"with coordination only their two pollers export them, so a tray that polls none serves "
              f"{sum(quiet.values()) - c['quiet_shared']:,}.", ""]
    return "\n".join(lines)


def with_section(catalogue: str, section: str) -> str:
    """The catalogue text with its series section replaced (or appended)."""
    head = catalogue.split(MARK, 1)[0].rstrip("\n")
    return head + "\n\n" + section


def main() -> int:
    c = asyncio.run(counts())
    CATALOGUE.write_text(with_section(CATALOGUE.read_text(), render_section(c)))
    print(f"wrote {CATALOGUE.relative_to(REPO)}: quiet {sum(c['quiet'].values())}, faulted "
          f"{sum(c['faulted'].values())}, all detail {sum(c['detail'].values())} series", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
