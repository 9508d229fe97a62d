"""Per-GPU roll-ups of the per-link NVLink families: error counts by type, traffic, worst BER, links by remote.

Why: a GB200 GPU has 18 links and NVML ten error counters per link, nearly all zero; /metrics exports a link's
series only where they carry information (agent/series_budget.py), so the GPU as a whole needs series that always
exist: a counter that exists from the start is what rate() and increase() need to see a GPU's first error, and a
dashboard that sums over links reads one series a GPU instead of 18. Computed from the poll's own readings, so the
roll-up and its links are one snapshot. A separate family, not a `link="all"` series of the per-link family: a
sum over that family's links would then count every error twice (Prometheus' rule: one aggregation level per
metric name).

A total whose links were not all read is not a total: it takes the quality of an input that is not ok (so it is
not exported and `supernode_reading_quality` says why), never a smaller sum presented as the whole.
"""

from __future__ import annotations

from typing import Iterable

from exporters.gpu import nvml_metrics as M
from exporters.model import MetricSpec, Quality, Reading

# per-link family -> (its GPU roll-up, the label kept beside gpu/uuid, how values combine)
ROLLUPS: dict[str, tuple[MetricSpec, str | None, str]] = {
    M.NVLINK_ERRORS.name: (M.GPU_NVLINK_ERRORS, "type", "sum"),
    M.NVLINK_BER.name: (M.GPU_NVLINK_BER_MAX, "kind", "max"),
    M.NVLINK_TX.name: (M.GPU_NVLINK_TX, None, "sum"),
    M.NVLINK_RX.name: (M.GPU_NVLINK_RX, None, "sum"),
    M.NVLINK_REMOTE.name: (M.GPU_NVLINK_REMOTE, "remote_type", "count"),
}


def gpu_rollups(readings: Iterable[Reading]) -> list[Reading]:
    """One reading per GPU (and type or kind) of each rolled-up family, from the per-link readings given."""
    acc: dict[tuple[str, str, str, str], list] = {}  # (family, gpu, uuid, sub) -> [spec, sub label, how, value, quality, ts]
    for r in readings:
        rule = ROLLUPS.get(r.spec.name)
        if rule is None or r.quality is Quality.UNSUPPORTED:  # a type the GPU lacks has no total (its mark says so)
            continue
        spec, sub_label, how = rule
        labels = r.labels
        sub = labels.get(sub_label, "") if sub_label else ""
        key = (spec.name, labels.get("gpu", ""), labels.get("uuid", ""), sub)
        slot = acc.get(key)
        if slot is None:
            slot = acc[key] = [spec, sub_label, how, 0.0, Quality.OK, r.timestamp]
        if r.quality is not Quality.OK:
            slot[4] = r.quality
        elif how == "sum":
            slot[3] += r.value
        elif how == "count":
            slot[3] += 1
        else:
            slot[3] = max(slot[3], r.value)
        slot[5] = max(slot[5], r.timestamp)
    out = []
    for (_, gpu, uuid, sub), (spec, sub_label, _how, value, quality, ts) in acc.items():
        labels = {"gpu": gpu, "uuid": uuid}
        if sub_label:
            labels[sub_label] = sub
        out.append(Reading(spec, value if quality is Quality.OK else float("nan"), labels, quality, ts))
    return out
