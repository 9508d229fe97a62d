"""The Debian package and the venv install, exactly as README's install section describes them.

The package is built (packaging/build_deb.py, what `make deb` runs), installed with
`dpkg -i` on this machine, its unit checked with `systemd-analyze verify` and
`security --offline=true`, its config with the installed `check-config`, then purged.
It needs root and dpkg (CI has both); SUPERNODE_TEST_ALLOW_MISSING_PEERS=1 skips it
where dpkg-deb is missing.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, require_binary, unit_environment


def _load_builder():
    """packaging/build_deb.py by path: `packaging` is also the name of a PyPI package."""
    spec = importlib.util.spec_from_file_location("build_deb", REPO / "packaging" / "build_deb.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_deb = _load_builder()

PREFIX = Path("/opt/supernode-agent")
ETC = Path("/etc/supernode-agent")
STATE = Path("/var/lib/supernode-agent")
UNIT = Path("/lib/systemd/system/supernode-agent.service")
SECRETS = [Path(ref["file"]) for ref in yaml.safe_load((REPO / "examples" / "agent.yaml").read_text())["secrets"].values()]
INSTALLED = [PREFIX, ETC, STATE, UNIT, Path("/usr/bin/supernode-agent")]


def _run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """The project and its dependencies as wheels, built once for both install paths."""
    path = tmp_path_factory.mktemp("wheels")
    build_deb.build_wheels(path)
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


# Building wheels and a venv takes about a minute on the 2-core CI machine; more under load. A kill by the
# default 120 s timeout would skip the purge below and leave the package installed.
@pytest.mark.timeout(600)
def test_deb_installs_verifies_and_purges(tmp_path, wheelhouse):
    require_binary("dpkg-deb")
    dpkg = require_binary("dpkg")
    analyze = require_binary("systemd-analyze")
    assert os.geteuid() == 0, "installing the package needs root (CI runs as root)"
    status = _run([dpkg, "-s", "supernode-agent"])
    present = [str(p) for p in INSTALLED if p.exists() or p.is_symlink()]
    assert status.returncode != 0 and not present, f"refusing to overwrite an installation on this machine: {present}"

    deb = build_deb.build(tmp_path / "out", wheelhouse)
    assert deb.name == f"supernode-agent_{build_deb.project_version()}_amd64.deb"
    try:
        inst = _run([dpkg, "-i", str(deb)])
        assert inst.returncode == 0, inst.stdout + inst.stderr
        # Never enabled or started by the package itself.
        assert not Path("/etc/systemd/system/multi-user.target.wants/supernode-agent.service").exists()
        assert "systemctl enable --now" in inst.stdout  # the postinst tells the operator the next step instead

        for secret in SECRETS:
            assert secret.is_file(), f"postinst did not create {secret}"
            assert _mode(secret) == 0o600 and secret.stat().st_uid == 0, f"{secret}: {oct(_mode(secret))}"
            assert secret.read_text().strip(), f"{secret} is empty"
        assert STATE.is_dir() and _mode(STATE) == 0o750
        assert _mode(ETC) == 0o750 and _mode(ETC / "agent.yaml") == 0o640
        assert (ETC / "agent.yaml").read_text() == (REPO / "examples" / "agent.yaml").read_text()

        unit_text = UNIT.read_text()
        for line in unit_text.splitlines():
            if line.startswith(("ExecStart=", "ExecStartPre=")):
                exe = Path(line.split("=", 1)[1].split()[0])
                assert exe.is_file() and os.access(exe, os.X_OK), line
        verify = _run([analyze, "verify", str(UNIT)])
        assert verify.returncode == 0 and verify.stdout.strip() == "" and verify.stderr.strip() == "", \
            verify.stdout + verify.stderr
        security = _run([analyze, "security", "--offline=true", str(UNIT)])
        assert security.returncode == 0, security.stderr
        score = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", security.stdout).group(1))
        print(f"installed unit exposure: {score}")
        assert score == readme_exposure(), "README states another exposure than the tool reports"

        # The unit's ExecStartPre, as systemd runs it (in the unit's environment), and the operator's command on PATH.
        pre = next(l for l in unit_text.splitlines() if l.startswith("ExecStartPre=")).split("=", 1)[1].split()
        unit_env = unit_environment(unit_text)
        # the bytecode the daemon runs under that environment ships compiled: nothing is written at run time
        level = unit_env.get("PYTHONOPTIMIZE")
        assert level and list(Path("/opt/supernode-agent/lib").glob(f"python3*/site-packages/agent/__pycache__/"
                                                                     f"daemon.cpython-*.opt-{level}.pyc"))
        check = _run(pre, env={**os.environ, **unit_env})
        assert check.returncode == 0 and ": ok (" in check.stdout, check.stdout + check.stderr
        assert _run(["/usr/bin/supernode-agent", "--help"]).returncode == 0

        # Reinstall (an upgrade): the operator's secrets and config are kept, never regenerated.
        before = {s: s.read_bytes() for s in SECRETS}
        again = _run([dpkg, "-i", str(deb)])
        assert again.returncode == 0, again.stdout + again.stderr
        assert {s: s.read_bytes() for s in SECRETS} == before
    finally:
        purge = _run([dpkg, "--purge", "supernode-agent"])
    assert purge.returncode == 0, purge.stdout + purge.stderr
    left = [str(p) for p in INSTALLED if p.exists() or p.is_symlink()]
    assert not left, f"purge left {left}"


def test_postinst_writes_secrets_under_umask_077():
    """No byte of a secret is ever written to a file others can read: every write is inside `(umask 077 && ...)`."""
    script = (REPO / "packaging" / "debian" / "postinst").read_text()
    writes = [l.strip() for l in script.splitlines() if ">" in l and not l.strip().startswith("#") and "/dev/null" not in l]
    assert writes, "postinst writes no secret"
    for line in writes:
        assert line.startswith("(umask 077 &&"), line
    assert "systemctl enable" not in script.replace("'systemctl enable --now supernode-agent'", "")
    assert "systemctl start" not in script and "deb-systemd-invoke start" not in script


def readme_exposure() -> float:
    """The exposure level README claims for the unit."""
    m = re.search(r"exposure level of \*\*([0-9.]+) \(OK\)\*\*", (REPO / "README.md").read_text())
    assert m, "README does not state the unit's exposure level"
    return float(m.group(1))


def readme_block(heading: str) -> str:
    """The first fenced code block after a README heading: the commands an operator copies."""
    text = (REPO / "README.md").read_text()
    section = text.split(heading, 1)[1]
    return section.split("```", 2)[1]


def test_readme_package_install_block_names_what_the_package_builds():
    block = readme_block("### Debian package")
    assert "make deb" in block and "dpkg -i build/supernode-agent_" in block
    assert "check-config /etc/supernode-agent/agent.yaml" in block
    assert "systemctl enable --now supernode-agent" in block


def test_readme_venv_install_creates_every_secret_0600_before_writing():
    block = readme_block("### Virtual environment")
    assert "python3 -m venv /opt/supernode-agent" in block and "/opt/supernode-agent/bin/pip install" in block
    umask_at = block.index("umask 077")
    for secret in SECRETS:
        assert str(secret) in block, f"README's venv install does not create {secret}"
        assert block.index(str(secret)) > umask_at, f"{secret} written before umask 077"
    assert "chmod" not in block, "secrets are created 0600, not chmod-ed after being written"


@pytest.mark.timeout(600)
def test_venv_install_as_readme_describes(tmp_path, wheelhouse):
    """`python3 -m venv` + `pip install .` (PEP 668 forbids the system Python), then check-config on the example."""
    venv = tmp_path / "venv"
    assert _run(["/usr/bin/python3", "-m", "venv", str(venv)]).returncode == 0
    # README's `pip install .`, offline: the wheelhouse holds this checkout's own wheel (`pip wheel .`) and its
    # dependencies, so the index is not resolved a second time (a minute on a loaded 2-core machine).
    pip = _run([str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile", "--no-index",
                "--find-links", str(wheelhouse), "supernode-agent"])
    assert pip.returncode == 0, pip.stderr
    etc = tmp_path / "etc"
    etc.mkdir(mode=0o750)
    config = yaml.safe_load((REPO / "examples" / "agent.yaml").read_text())
    for name, ref in config["secrets"].items():
        path = etc / Path(ref["file"]).name
        path.write_text("x" * 32 + "\n")
        ref["file"] = str(path)
    cfg = etc / "agent.yaml"
    cfg.write_text(yaml.safe_dump(config))
    check = _run([str(venv / "bin" / "supernode-agent"), "check-config", str(cfg)])
    assert check.returncode == 0, check.stdout + check.stderr
    assert Path(sys.executable).resolve() != (venv / "bin" / "python").resolve()
    # the status page's files are package data: an installed agent serves them from its own tree
    files = _run([str(venv / "bin" / "python"), "-c",
                  "import agent.status.http as s; print(' '.join(sorted(p.name for p in s.STATIC.iterdir())))"])
    assert {"icon.svg", "index.html", "status.css", "status.js"} <= set(files.stdout.split()), files.stdout + files.stderr

    # The agent without the simulator (a distribution of its own): nothing of it is installed, and a config that
    # names a simulated backend says which field asks for it and what to install, at the point it is built.
    probe = ("import importlib.util, sys\n"
             "from agent.config import ConfigError, load_config\n"
             "from agent.remediation.wiring import _scheduler\n"
             "from agent.sources import nvml_library\n"
             "print('sim module:', importlib.util.find_spec('sim'))\n"
             "loaded = load_config(sys.argv[1])\n"
             "for build in (nvml_library, _scheduler):\n"
             "    try:\n"
             "        print('built', build(loaded))\n"
             "    except ConfigError as exc:\n"
             "        print('ConfigError', exc)\n")
    config["sources"]["nvml"] = {**config["sources"]["nvml"], "backend": "sim", "sim_url": "http://127.0.0.1:9"}
    config["remediation"]["slurm"] = {**config["remediation"].get("slurm", {}), "backend": "simulated"}
    cfg.write_text(yaml.safe_dump(config))
    out = _run([str(venv / "bin" / "python"), "-c", probe, str(cfg)], cwd=tmp_path)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 3, out.stdout + out.stderr
    assert lines[0] == "sim module: None"
    for line, field in zip(lines[1:], ("sources.nvml.backend", "remediation.slurm.backend")):
        assert line.startswith(f"ConfigError {field}: ") and "install supernode-sim" in line, line
    help_text = _run([str(venv / "bin" / "supernode-agent"), "--help"]).stdout
    commands = next(g.split(",") for g in re.findall(r"\{([a-z,-]+)\}", help_text) if "check-config" in g)
    assert "probe" in commands and "sim" not in commands and "demo" not in commands, help_text


def test_the_wheel_ships_the_agent_without_its_simulator(wheelhouse):
    """`pip wheel .` builds the agent and its exporters; the simulator is `supernode-sim` (sim/pyproject.toml)."""
    import zipfile

    (wheel,) = wheelhouse.glob("supernode_agent-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"agent", "exporters", f"supernode_agent-{build_deb.project_version()}.dist-info"}, tops
    # nor where it used to live (a stale build/ of the checkout must not bring it back)
    assert not [n for n in names if n.startswith("agent/sim/") or n in ("agent/nvml_twin.py", "agent/demo.py")]
