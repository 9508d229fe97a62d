"""The layering rule of docs/architecture.md, checked: exporters never import agent; remediation never
reaches into collector internals (only the shared model, validation and the device control primitives)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

# What remediation may use from exporters: the shared model, file reading and validation (with its error), the
# control primitives it acts through, NVIDIA's XID catalogue (data the GPU fault judge reads, no collector), and the
# fabric registration read (one reader for the metrics and the resume gate, no collector state).
REMEDIATION_MAY_IMPORT = {"exporters.model", "exporters.validation", "exporters.safe_yaml", "exporters.gpu.nvml_control",
                          "exporters.errors", "exporters.gpu.xid_catalogue", "exporters.gpu.nvml_fabric",
                          # pure data, no device I/O: the coolant's physical properties (the derate's heat balance) and
                          # the Modbus CDU's metric specs (the families the CDU view translates a Redfish CDU into)
                          "exporters.cooling.coolant", "exporters.cooling.modbus_metrics"}


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


# Run in a clean interpreter: load the config, build every source and the remediation engine (its executors,
# scheduler included), then say what was built and which simulator modules are loaded.
BUILD_EVERYTHING = """
import json, sys
from agent.config import load_config
from agent.sources import build_sources
from agent.remediation.wiring import build_engine
loaded = load_config(sys.argv[1])
sources = build_sources(loaded)
build_engine(loaded)
print(json.dumps({"sources": sorted({s.source.name for s in sources}),
                  "simulator": sorted(m for m in sys.modules if m == "sim" or m.startswith("sim."))}))
"""
# What the entry points of the backends a sim-backed config names load, alone (agent/backends.py).
BACKENDS_ALONE = """
import json, sys
from agent.backends import NVML_TWIN, SCHEDULER_SIMULATED, load_backend
for name in (NVML_TWIN, SCHEDULER_SIMULATED):
    load_backend(name, "test")
print(json.dumps(sorted(m for m in sys.modules if m == "sim" or m.startswith("sim."))))
"""


def test_building_every_source_of_a_sim_backed_config_loads_no_simulator_module(tmp_path):
    """The same rule at run time. The demo's config for a simulated rack (NVML from the twin, CDU over Modbus,
    leak controller, PDUs over SNMP, Redfish trays and CDU, links and DOM) is loaded and every source of it built,
    with the remediation engine, in a fresh interpreter: of the simulator, only what its two entry points (the
    NVML twin, the simulated scheduler) load by themselves is loaded; nothing the agent runs imports more."""
    import json
    import subprocess
    import sys

    import yaml

    from sim.demo import agent_config
    from tests.helpers import free_port
    from sim.harness import sim_rack

    for name in ("admin.token", "webhook.token"):
        (tmp_path / name).write_text("layering-test-token\n")
    alone = subprocess.run([sys.executable, "-c", BACKENDS_ALONE], capture_output=True, text=True, cwd=REPO,
                           timeout=120)
    assert alone.returncode == 0, alone.stderr[-3000:]
    backends = set(json.loads(alone.stdout.strip().splitlines()[-1]))
    assert "sim.nvml_twin" in backends and "sim.scheduler" in backends, backends
    with sim_rack(tmp_path) as rack:
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="observe")
        (tmp_path / "agent.yaml").write_text(yaml.safe_dump(cfg))
        out = subprocess.run([sys.executable, "-c", BUILD_EVERYTHING, str(tmp_path / "agent.yaml")],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    built = json.loads(out.stdout.strip().splitlines()[-1])
    # Not vacuous: every kind of source the simulated rack offers was built (and imported its collector).
    assert {"nvml", "links", "dom", "cdu", "leak", "pdu", "redfish"} <= set(built["sources"]), built
    # The simulator is reached only through the entry points the config asks for: nothing more of it is loaded.
    assert set(built["simulator"]) <= backends, sorted(set(built["simulator"]) - backends)


def test_a_v2c_only_agent_never_loads_pysnmp():
    """pysnmp's engine (and its crypto, ~30 MB resident) is for v3 devices only: a v2c client does without."""
    import subprocess
    import sys

    code = ("import sys, agent.daemon, agent.sources, exporters.power.pdu; "
            "from exporters.snmp.client import SnmpClient, SnmpCredentials; "
            "c = SnmpClient('127.0.0.1', 161, SnmpCredentials(community='public')); c.close(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pysnmp', 'pysmi', 'cryptography'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _calls(path: Path) -> set[str]:
    """Dotted names called in a file (`yaml.safe_load(...)` -> "yaml.safe_load")."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            found.add(f"{node.func.value.id}.{node.func.attr}")
    return found


def test_every_yaml_file_is_read_through_safe_yaml():
    """exporters/safe_yaml.py bounds what a YAML file may cost (size, aliases, depth, duplicate keys); a plain
    yaml.safe_load anywhere in the product would read a FIFO forever or let a duplicate key silently win."""
    unsafe = {"yaml.safe_load", "yaml.load", "yaml.full_load", "yaml.unsafe_load", "yaml.load_all",
              "yaml.safe_load_all"}
    bad = {str(p.relative_to(REPO)): sorted(_calls(p) & unsafe)
           for root in ("agent", "exporters") for p in (REPO / root).rglob("*.py")}
    assert "yaml.safe_load" in _calls(REPO / "tests" / "test_reliability.py")  # the check sees calls (a test may)
    assert not {k: v for k, v in bad.items() if v}


# exporters/redfish/ is being changed elsewhere (issue 31); its two classes move to exporters/errors.py next.
def test_one_profile_error_and_one_probe_error():
    """Every collector raises the same ProfileError and ProbeError (exporters/errors.py), so the agent, check-config
    and probe catch one name each."""
    defined = {}
    for root in ("agent", "exporters"):
        for p in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text(), str(p))):
                if isinstance(node, ast.ClassDef) and node.name in ("ProfileError", "ProbeError"):
                    defined.setdefault(node.name, set()).add(str(p.relative_to(REPO)))
    assert defined == {"ProfileError": {"exporters/errors.py"}, "ProbeError": {"exporters/errors.py"}}


def test_tests_import_their_support_modules_one_way():
    """`from tests.helpers import ...`, never a bare `helpers`: with tests/ on sys.path too, `helpers` and
    `tests.helpers` would be two modules with two states (conftest.py puts only the repo root on the path)."""
    support = {p.stem for p in (REPO / "tests").glob("*.py")} - {"__init__", "conftest"}
    bare = {}
    for p in [*(REPO / "tests").glob("*.py"), *(REPO / "bench").glob("*.py")]:
        dynamic = {n.args[0].value for n in ast.walk(ast.parse(p.read_text(), str(p)))
                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "__import__"
                   and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)}
        used = {m.split(".")[0] for m in imports(p) | dynamic} & support
        if used:
            bare[str(p.relative_to(REPO))] = sorted(used)
    assert "helpers" not in {m.split(".")[0] for m in imports(REPO / "tests" / "test_layering.py")}
    assert "tests.helpers" in imports(REPO / "tests" / "test_layering.py")
    assert not bare
