"""Backends the simulator plugs into the agent (the NVML twin, the simulated scheduler), found by entry point.

Why entry points: the agent ships without the simulator (`supernode-sim` is a
distribution of its own), yet the config format names its backends
(`sources.nvml.backend: sim`, `remediation.slurm.backend: simulated`). The
simulator registers them in the `supernode_agent.backends` group; the agent
looks them up by name and never imports the simulator's package, and a
config that asks for one where the simulator is not installed gets an error
that names the field and what to install.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from agent.config import ConfigError

GROUP = "supernode_agent.backends"
NVML_TWIN = "nvml_twin"  # (sim_url or None, node) -> a pynvml-like twin; None: the running simulator, found by itself
SCHEDULER_SIMULATED = "scheduler_simulated"  # (nodes) -> an in-process scheduler with SlurmScheduler's interface


def load_backend(name: str, field: str) -> Any:
    """The object registered as `name` in the simulator's entry points; ConfigError naming `field` when absent."""
    found = entry_points(group=GROUP, name=name)
    if not found:
        raise ConfigError(f"{field}: this backend is the simulator's ({GROUP}: {name}), and the simulator is not "
                          "installed: install supernode-sim (from a source tree: pip install -e ./sim)")
    entry = next(iter(found))
    try:
        return entry.load()
    except ImportError as exc:
        raise ConfigError(f"{field}: the simulator's backend {name} ({entry.value}) does not load: {exc}") from None
