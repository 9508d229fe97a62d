"""Plug-ins depend on the typed AgentContext (agent/context.py), not on the daemon's Agent (issue 32).

The HTTP surface, the status page, the Redfish push endpoint and remediation's wiring used to import `Agent`
under TYPE_CHECKING to close an import cycle; now only the CLI (which runs the daemon) imports agent.daemon,
and the running Agent is checked to offer every field and method the protocol promises.
"""

from __future__ import annotations

import ast

from agent.config import parse_config
from agent.context import AgentContext
from agent.daemon import Agent
from tests.helpers import REPO

PLUGINS = ["agent/http.py", "agent/status/http.py", "agent/redfish_events.py", "agent/remediation/wiring.py"]


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_only_the_cli_imports_the_daemon():
    importers = sorted(str(p.relative_to(REPO)) for p in (REPO / "agent").rglob("*.py")
                       if "agent.daemon" in _imports(p))
    assert importers == ["agent/cli.py"], importers


def test_plugins_take_the_agent_context():
    for rel in PLUGINS:
        assert "agent.context" in _imports(REPO / rel), rel


def test_the_running_agent_offers_everything_the_context_promises(tmp_path):
    loaded = parse_config({"agent": {"rack": "r1", "node": "n1", "state_dir": str(tmp_path / "state")},
                           "inventory": {"nodes": ["n1"]}})
    agent = Agent(loaded, source_factory=lambda *_: [])
    assert isinstance(agent, AgentContext)
    promised = set(AgentContext.__annotations__) | {n for n in vars(AgentContext) if not n.startswith("_")}
    missing = sorted(n for n in promised if not hasattr(agent, n))
    assert not missing, missing
