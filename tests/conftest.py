"""Shared pytest setup: the repo root is importable, so every test module imports its support modules one way,
`from tests.helpers import ...` (never a bare `helpers`, which would load a second copy of the module with its own
state, e.g. the ports it has handed out)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

# Property-based tests (hypothesis): a small, derandomized run in `make test` (seconds, the same examples
# every run, so never flaky); `make fuzz` selects the `fuzz` profile through HYPOTHESIS_PROFILE and runs
# every hypothesis test (marked `fuzz` below) with many more random examples.
try:
    from hypothesis import settings as _hypothesis_settings
except ImportError:  # the test extra is not installed: hypothesis tests fail on import, the rest run
    pass
else:
    import os as _os

    _hypothesis_settings.register_profile("default", max_examples=60, deadline=None, derandomize=True,
                                          database=None)
    _hypothesis_settings.register_profile("fuzz", max_examples=5_000, deadline=None, database=None)
    _hypothesis_settings.load_profile(_os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs modules on parallel workers), each worker hands out loopback ports
    from its own slice of the range (sim/ports.py), so two workers never start peers on one port."""
    import os

    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit():
        os.environ["SUPERNODE_PORT_SLICE"] = f"{int(worker[2:])}/{int(count)}"


def pytest_runtest_setup(item):
    from tests.agentproc import AgentProcess

    AgentProcess.stopped.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails while real agents run carries the tail of each one's log in its report (those its own
    `with` block already stopped too): a failure seen once under load in CI is then explained by what the
    agents did, not guessed at from a timeout."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    from tests.agentproc import AgentProcess

    for agent in sorted({*AgentProcess.running, *AgentProcess.stopped}, key=lambda a: str(a.log_path)):
        node = agent.config.get("agent", {}).get("node", "?")
        report.sections.append((f"agent {node} log ({agent.log_path})", agent.log_tail()))


def pytest_collection_modifyitems(config, items):
    """Every hypothesis test carries the `fuzz` marker, so `make fuzz` (pytest -m fuzz) finds them all. A `repeat`
    test (a loop of runs another test makes once) is `make fuzz`'s too: outside the fuzz profile it is deselected,
    not skipped, so `make test` spends no time on it and reports no skip."""
    import os

    import pytest

    deep = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
    kept, dropped = [], []
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.fuzz)
        if item.get_closest_marker("repeat") is not None:
            item.add_marker(pytest.mark.fuzz)
            if not deep:
                dropped.append(item)
                continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    # Longest modules first (tests/module_seconds.py: why), so the parallel workers finish together.
    from tests.module_seconds import load, longest_first

    items[:] = longest_first(kept, load())
