"""The layering rule of docs/architecture.md, checked: exporters never import agent; remediation never
reaches into collector internals (only the shared model, validation and the device control primitives)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

# What remediation may use from exporters: the shared model, file reading and validation, and the control
# primitives it acts through.
REMEDIATION_MAY_IMPORT = {"exporters.model", "exporters.validation", "exporters.safe_yaml", "exporters.gpu.nvml_control"}


def imports(path: Path, module_level_only: bool = False) -> set[str]:
    """Absolute imports of a file: anywhere in it, or only those run when the module loads."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in (tree.body if module_level_only else ast.walk(tree)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_exporters_never_import_agent():
    offenders = {str(p.relative_to(REPO)): sorted(m for m in imports(p) if m == "agent" or m.startswith("agent."))
                 for p in (REPO / "exporters").rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


def test_remediation_uses_only_the_model_and_control_primitives():
    bad = {}
    for p in (REPO / "agent" / "remediation").rglob("*.py"):
        if p.name == "wiring.py":  # the one place that hands devices to the engine
            continue
        used = {m for m in imports(p) if m.startswith("exporters")} - REMEDIATION_MAY_IMPORT
        if used:
            bad[str(p.relative_to(REPO))] = sorted(used)
    assert not bad


def test_the_check_sees_imports():
    # The checks above would pass vacuously if imports() found nothing.
    assert "exporters.model" in imports(REPO / "agent" / "remediation" / "detectors_base.py")
    assert "agent.snapshot" in imports(REPO / "agent" / "exposition.py")
    assert "agent.backends" in imports(REPO / "agent" / "sources.py")  # an import inside a function counts


def test_nothing_under_agent_or_exporters_imports_the_simulator():
    """The simulator (sim/, the supernode-sim distribution) is not shipped: no import of it anywhere in the product,
    function-level ones included. A config that names the twin or the simulated scheduler reaches them through
    the entry points the simulator registers (agent/backends.py)."""
    bad = {}
    for root in ("agent", "exporters"):
        for p in (REPO / root).rglob("*.py"):
            sim = sorted(m for m in imports(p) if m == "sim" or m.startswith("sim."))
            if sim:
                bad[str(p.relative_to(REPO))] = sim
    assert not bad


def test_the_daemon_loads_no_simulator_module():
    """The same rule at run time: the daemon's modules load nothing of the simulator."""
    import subprocess
    import sys

    code = ("import sys, agent.daemon, agent.sources, agent.remediation.wiring; "
            "print(sorted(m for m in sys.modules if m == 'sim' or m.startswith('sim.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_v2c_only_agent_never_loads_pysnmp():
    """pysnmp's engine (and its crypto, ~30 MB resident) is for v3 devices only: a v2c client does without."""
    import subprocess
    import sys

    code = ("import sys, agent.daemon, agent.sources, exporters.power.pdu; "
            "from exporters.power.snmp_client import SnmpClient, SnmpCredentials; "
            "c = SnmpClient('127.0.0.1', 161, SnmpCredentials(community='public')); c.close(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pysnmp', 'pysmi', 'cryptography'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
