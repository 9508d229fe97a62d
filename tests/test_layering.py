"""The layering rule of ARCHITECTURE.md, checked: exporters never import agent; remediation never
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
    assert "exporters.model" in imports(REPO / "agent" / "remediation" / "detectors.py")
    assert "agent.snapshot" in imports(REPO / "agent" / "exposition.py")


# The simulator's front ends: `sim ...` and `probe --sim` find the simulator, `demo` (sim/demo.py) starts
# it. Everything else (the daemon, its sources, remediation, exporters) must run without loading sim.
SIMULATOR_FRONT_ENDS = {"agent/cli.py", "agent/probe.py"}
SIMULATOR_LAUNCHER = "sim/demo.py"


def test_production_modules_never_import_the_simulator():
    bad = {}
    for root in ("agent", "exporters"):
        for p in (REPO / root).rglob("*.py"):
            rel = str(p.relative_to(REPO))
            if rel.startswith("sim/") or rel == SIMULATOR_LAUNCHER:
                continue
            # Front ends may import it lazily, inside the commands that serve the simulator, never at load.
            used = imports(p, module_level_only=rel in SIMULATOR_FRONT_ENDS)
            sim = sorted(m for m in used if m == "sim" or m.startswith("sim."))
            if sim:
                bad[rel] = sim
    assert not bad


def test_the_daemon_loads_no_simulator_module():
    """The same rule at run time: building every source of a sim-backed config imports nothing of sim."""
    import subprocess
    import sys

    code = ("import sys, agent.daemon, agent.sources, agent.remediation.wiring, sim.nvml_twin; "
            "print(sorted(m for m in sys.modules if m.startswith('sim')))")
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
