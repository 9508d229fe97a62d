"""The agent's metrics about itself, from the real daemon: build info, process metrics, reload results."""

from __future__ import annotations

import copy
import platform
import re
import subprocess

from agent import __version__
from tests.agentproc import base_config, running_agent
from tests.helpers import require_binary

TOKEN = "admin-token-for-tests"


def _value(text: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert match, f"{series} not in /metrics"
    return float(match.group(1))


def test_build_process_and_reload_metrics_of_the_running_agent(tmp_path):
    promtool = require_binary("promtool")
    cfg = base_config(tmp_path, TOKEN)
    with running_agent(cfg, tmp_path) as agent:
        text = agent.metrics()
        assert 'supernode_build_info{prometheus_client="' in text
        assert f'python="{platform.python_version()}",version="{__version__}"}} 1.0' in text
        assert _value(text, "process_start_time_seconds") > 0
        assert _value(text, "process_resident_memory_bytes") > 0
        assert "# TYPE process_cpu_seconds_total counter" in text and "python_info{" in text
        assert _value(text, 'supernode_config_reload_total{result="success"}') == 0
        assert _value(text, 'supernode_config_reload_total{result="failure"}') == 0
        assert _value(text, "supernode_config_last_reload_successful") == 1
        loaded_at = _value(text, "supernode_config_last_reload_success_timestamp_seconds")
        assert loaded_at >= _value(text, "process_start_time_seconds") - 1  # the config loaded at start
        check = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True)
        assert check.returncode == 0, check.stdout + check.stderr

        agent.write_config('agent: {rack: r01, node: ""}\n')
        status, _ = agent.request("POST", "/-/reload", token=TOKEN)
        assert status == 400
        text = agent.metrics()
        assert _value(text, 'supernode_config_reload_total{result="failure"}') == 1
        assert _value(text, "supernode_config_last_reload_successful") == 0
        assert _value(text, "supernode_config_last_reload_success_timestamp_seconds") == loaded_at

        good = copy.deepcopy(cfg)
        good["agent"]["role"] = "gpu-tray"
        agent.write_config(good)
        status, body = agent.request("POST", "/-/reload", token=TOKEN)
        assert status == 200, body
        text = agent.metrics()
        assert _value(text, 'supernode_config_reload_total{result="success"}') == 1
        assert _value(text, 'supernode_config_reload_total{result="failure"}') == 1
        assert _value(text, "supernode_config_last_reload_successful") == 1
        assert _value(text, "supernode_config_last_reload_success_timestamp_seconds") >= loaded_at
