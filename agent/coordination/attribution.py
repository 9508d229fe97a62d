"""Switch-side or tray-side: which NVLink failures of the rack are one NVSwitch chip's, from every tray's links.

Why across the rack: on a GB200 NVL72 NVLink index k of every GPU reaches NVSwitch chip k, so a failing chip
(or its cable cartridge) shows up as "my link k is down" on every compute tray at once, while no agent watches
the switch itself. One tray alone cannot tell its own bad link from a bad switch; the rack can: the same link
index failing on at least `min_trays` trays is the switch chip's fault (switch-side), a failure seen on fewer
trays is that tray's own (tray-side, drained as before).

A pure function of the trays' published link vectors (agent.coordination.link_vectors) and the clock, so every
agent that holds the same vectors reaches the same verdict, and it is unit-tested on recorded vectors:

- only fresh vectors count: a tray that stopped publishing (its key gone with its lease) or whose vector is
  older than `max_age` seconds (an agent alive but its NVML reads stuck) is neither evidence for a switch
  fault nor judged; it is listed as silent or stale;
- the threshold is `min_trays`, lowered to the rack's own size for a rack of fewer trays (a 2-tray rack with
  link k down on both is the switch's), never below 2 (one tray never proves a switch fault);
- ties are settled without order: exactly the threshold counts (>=), every qualifying chip is named (chips
  sorted), and a tray whose failures are partly switch-side keeps its other links tray-side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from agent.coordination.link_vectors import FAILING, LinkVector


@dataclass(frozen=True, slots=True)
class Attribution:
    """The rack's verdict: chips at fault (switch-side), the trays' own failing links, and whose vectors counted."""

    threshold: int
    switch_chips: tuple[int, ...] = ()  # chips whose link index fails on >= threshold trays, sorted
    trays_by_chip: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # chip -> the trays that see it
    tray_side: tuple[tuple[str, str, int], ...] = ()  # (node, gpu, link) failing and not switch-side, sorted
    counted: tuple[str, ...] = ()  # trays whose fresh vector was read
    stale: tuple[str, ...] = ()  # trays whose vector is older than max_age
    silent: tuple[str, ...] = ()  # inventory trays with no vector at all

    def switch_side(self, link: int) -> bool:
        return link in self.switch_chips


def threshold_for(min_trays: int, rack_trays: int) -> int:
    """`min_trays`, or the rack's own tray count when it has fewer, and never below 2."""
    return max(2, min(min_trays, rack_trays))


def attribute(vectors: Mapping[str, LinkVector], rack_nodes: Iterable[str], now: float, min_trays: int,
              max_age: float) -> Attribution:
    """The verdict over `vectors` (node -> its latest vector) for a rack of `rack_nodes` (see the module doc)."""
    nodes = sorted(set(rack_nodes))
    threshold = threshold_for(min_trays, len(nodes))
    fresh: dict[str, LinkVector] = {}
    stale: list[str] = []
    for node in nodes:
        v = vectors.get(node)
        if v is None:
            continue
        if now - v.at > max_age:
            stale.append(node)
        else:
            fresh[node] = v
    seen: dict[int, set[str]] = {}
    for node, v in fresh.items():
        for links in v.gpus.values():
            for k, state in enumerate(links):
                if state in FAILING:
                    seen.setdefault(k, set()).add(node)
    chips = tuple(sorted(k for k, trays in seen.items() if len(trays) >= threshold))
    tray_side = sorted((node, gpu, k) for node, v in fresh.items() for gpu, links in v.gpus.items()
                       for k, state in enumerate(links) if state in FAILING and k not in chips)
    return Attribution(threshold, chips, {k: tuple(sorted(seen[k])) for k in chips}, tuple(tray_side),
                       tuple(sorted(fresh)), tuple(stale), tuple(n for n in nodes if n not in vectors))


def switch_tray_of(chip: int, switch_trays: Iterable[Any]) -> str:
    """The switch tray that holds `chip` per inventory.switch_trays ({name, chips}), or "" when none lists it."""
    for tray in switch_trays:
        chips = tray.get("chips", ()) if isinstance(tray, Mapping) else getattr(tray, "chips", ())
        if chip in chips:
            return str(tray.get("name") if isinstance(tray, Mapping) else getattr(tray, "name", ""))
    return ""
