"""Hostile config files: every one fails with one short message naming the field or line, never a traceback,
never a hang, never unbounded memory (issue 18, items 2 and 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.config import ConfigError, load_config
from tests.helpers import REPO
from tests.test_config import minimal

# The 423-byte "billion laughs" of the issue: 9 ** 9 strings once expanded.
BOMB = "\n".join(["a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]"] +
                 [f"{c}: &{c} [{','.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]) + "\n"


def check_config(path: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", "check-config", str(path)], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout)


def config_error(path: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    msg = str(exc.value)
    assert len(msg) < 600, msg[:2000]
    return msg


def write(tmp_path: Path, text: str | bytes, name: str = "agent.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_alias_bomb_fails_check_config_with_a_short_message(tmp_path):
    assert len(BOMB) < 450
    out = check_config(write(tmp_path, BOMB))
    assert out.returncode == 1
    assert "YAML aliases expand" in out.stderr, out.stderr[:500]
    assert len(out.stderr) < 300 and "Traceback" not in out.stderr, out.stderr[:2000]


def test_alias_bomb_inside_a_valid_config_is_refused(tmp_path):
    text = yaml.safe_dump(minimal(tmp_path)) + BOMB.replace("a:", "x0:", 1)
    assert "YAML aliases expand this to more than 100000 values" in config_error(write(tmp_path, text))


def test_aliases_that_safe_dump_writes_for_shared_objects_still_load(tmp_path):
    """yaml.safe_dump writes an anchor and an alias for an object used twice: a small expansion is fine."""
    cfg = minimal(tmp_path)
    zone_nodes = ["node01", "node02"]
    cfg["inventory"] = {"nodes": zone_nodes, "leak_zones": [{"name": "z", "nodes": zone_nodes}]}
    text = yaml.safe_dump(cfg)
    assert "&id001" in text and "*id001" in text
    assert load_config(write(tmp_path, text)).config.inventory.leak_zones[0].nodes == ["node01", "node02"]


@pytest.mark.parametrize("text, expect", [
    (b"agent:\n  rack: r\xff01\n", "not UTF-8"),
    ("agent:\n  rack: r01\n  node: n\nlisten:\n  port: " + "9" * 5000 + "\n", "integer of 5000 digits"),
    ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
    ("{a: " * 100_000 + "1" + "}" * 100_000, "nested deeper than"),
    ("agent: {rack: r01, node: n1}\nagent: {rack: r02, node: n2}\n", "line 2: duplicate key 'agent'"),
])
def test_hostile_yaml_is_one_clean_message(tmp_path, text, expect):
    msg = config_error(write(tmp_path, text))
    assert expect in msg, msg


def test_config_file_over_the_size_limit_is_refused_unread(tmp_path):
    big = write(tmp_path, "# " + "x" * (2 << 20) + "\n")
    assert "limit" in config_error(big)


def test_config_that_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "agent.yaml"
    os.mkfifo(fifo)
    assert "not a regular file" in config_error(fifo)


def test_huge_values_in_errors_are_truncated(tmp_path):
    cfg = minimal(tmp_path)
    cfg["listen"]["address"] = "x" * 200_000
    cfg["inventory"] = {"gpus": {"count": ["y" * 2000] * 100}}
    msg = config_error(write(tmp_path, yaml.safe_dump(cfg)))
    assert "listen.address" in msg and "inventory.gpus.count" in msg


@pytest.mark.parametrize("kind", ["binary", "fifo", "dev_zero", "huge", "dir"])
def test_secret_file_must_be_a_small_regular_text_file(tmp_path, kind):
    secret = tmp_path / "webhook.token"
    if kind == "binary":
        secret.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    elif kind == "fifo":
        os.mkfifo(secret)  # nobody writes: reading it would hang
    elif kind == "dev_zero":
        secret = Path("/dev/zero")
    elif kind == "huge":
        secret.write_bytes(b"a" * (1 << 20))
    else:
        secret.mkdir()
    cfg = minimal(tmp_path)
    cfg["secrets"]["webhook_token"] = {"file": str(secret)}
    path = write(tmp_path, yaml.safe_dump(cfg))
    out = check_config(path)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[:2000]
    assert "secrets.webhook_token.file" in out.stderr and len(out.stderr) < 300, out.stderr


@pytest.mark.parametrize("section, profile, expect", [
    ("cdus", "no-such-cdu", "no profile 'no-such-cdu'"),
    ("leak_controllers", "../../../../tmp/x", "bare name"),
    ("pdus", "../../../../tmp/x", "bare name"),
    ("pdus", "no-such-pdu", "no profile 'no-such-pdu'"),
    ("cdus", "/etc/passwd", "bare name"),
])
def test_profile_is_a_bare_name_that_must_exist(tmp_path, section, profile, expect):
    (tmp_path / "x.yaml").write_text("name: x\n")
    cfg = minimal(tmp_path)
    cfg["inventory"] = {section: [{"name": "dev1", "profile": profile}]}
    msg = config_error(write(tmp_path, yaml.safe_dump(cfg)))
    assert f"inventory.{section}" in msg and expect in msg, msg


def test_shipped_profiles_still_pass(tmp_path):
    cfg = minimal(tmp_path)
    cfg["inventory"] = {"cdus": [{"name": "cdu1", "profile": "reference-cdu"}],
                        "pdus": [{"name": "pdu1", "profile": "raritan-pdu2"}]}
    loaded = load_config(write(tmp_path, yaml.safe_dump(cfg)))
    assert loaded.config.inventory.cdus[0].profile == "reference-cdu"


def test_reload_of_an_alias_bomb_is_refused_briefly_by_the_real_daemon(tmp_path):
    from tests.agentproc import base_config, running_agent

    with running_agent(base_config(tmp_path), tmp_path) as agent:
        agent.write_config(BOMB + "j: &j [" + ",".join(["*i"] * 9) + "]\n")
        status, body = agent.request("POST", "/-/reload", token="admin-token-for-tests")
        assert status == 400 and b"YAML aliases expand" in body, body[:500]
        assert len(body) < 1000, len(body)
        assert agent.get("/metrics")[0] == 200
        assert agent.state()["config"]["agent"]["node"] == "node01"  # the running config is kept


@pytest.mark.parametrize("mutate, where", [
    (lambda c, bad: c["secrets"].update(x={"file": bad}), "secrets.x.file"),
    (lambda c, bad: c.update(auth={"admin_tokens": {"ops": {"file": bad}}}), "auth.admin_tokens.ops.file"),
    (lambda c, bad: c.update(remediation={"playbook_dir": bad}), "remediation.playbook_dir"),
])
@pytest.mark.parametrize("bad", ["a\x00b", "/" + "a" * 5000], ids=["nul", "too_long"])
def test_hostile_paths_are_one_short_message(tmp_path, mutate, where, bad):
    """Found by tests/test_fuzz_input.py: a NUL byte or a 5,000-character path once raised ValueError/OSError."""
    cfg = minimal(tmp_path)
    mutate(cfg, bad)
    msg = config_error(write(tmp_path, yaml.safe_dump(cfg)))
    assert msg.startswith(where) and "\x00" not in msg, msg
