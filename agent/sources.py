"""Builds the configured sources from the inventory: the one place that knows which exporter serves what.

Imports of exporters are local to each builder so a node without, say, a
PDU never loads pysnmp, and so a broken optional dependency only disables
the source that needs it.
"""

from __future__ import annotations

from typing import Any, Callable

from agent.config import LoadedConfig
from agent.runtime import ScheduledSource
from exporters.base import Source


def nvml_library(loaded: LoadedConfig) -> Any:
    """The pynvml module, or the simulator's twin with the same function names."""
    cfg = loaded.config
    settings = cfg.sources.nvml
    if settings.backend == "sim":
        from agent.sim.nvml_twin import NvmlTwin

        if not settings.sim_url:
            from agent.config import ConfigError

            raise ConfigError("sources.nvml.sim_url: required when sources.nvml.backend is sim")
        return NvmlTwin(settings.sim_url, cfg.agent.node)
    import pynvml

    return pynvml


def _nvml(loaded: LoadedConfig) -> list[ScheduledSource]:
    cfg = loaded.config
    settings = cfg.sources.nvml
    if not settings.enabled:
        return []
    from exporters.nvml import NvmlSource

    src = NvmlSource(nvml_library(loaded), cfg.inventory.gpus.count, cfg.inventory.gpus.nvlinks_per_gpu,
                     call_timeout=settings.timeout, xid_events=settings.xid_events)
    return [ScheduledSource(src, settings)]


BUILDERS: list[Callable[[LoadedConfig], list[ScheduledSource]]] = [_nvml]


def build_sources(loaded: LoadedConfig) -> list[ScheduledSource]:
    sources: list[ScheduledSource] = []
    for builder in BUILDERS:
        sources.extend(builder(loaded))
    return sources


__all__ = ["build_sources", "nvml_library", "Source", "BUILDERS"]
