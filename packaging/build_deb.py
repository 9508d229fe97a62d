"""Build the supernode-agent Debian package (`make deb`).

Why a venv inside the package: Debian 12 refuses `pip install` into the system
Python (PEP 668), and the agent's dependencies (pydantic 2, pysnmp 7, pymodbus 3)
are newer than Debian's. So the package carries its own virtual environment at
/opt/supernode-agent, built with Debian's /usr/bin/python3 (the interpreter the
package depends on) from wheels, and relocated: a venv records its absolute path
in pyvenv.cfg, in script shebangs and in the activate scripts, which are
rewritten from the staging directory to /opt/supernode-agent.

Layout: /opt/supernode-agent (venv), /usr/bin/supernode-agent (symlink for
operators), /lib/systemd/system/supernode-agent.service (the unit of systemd/,
whose ExecStart already names /opt/supernode-agent/bin/supernode-agent),
/etc/supernode-agent/agent.yaml (conffile: examples/agent.yaml). The maintainer
scripts in packaging/debian/ create the state dir and the secret files.

Every external program runs from an argument list, never a shell string.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PREFIX = Path("/opt/supernode-agent")
UNIT_DIR = Path("/lib/systemd/system")
ETC = Path("/etc/supernode-agent")
TARGET_PYTHON = "/usr/bin/python3"  # Debian 12's python3.11: the package's Depends
SCRIPTS = ("postinst", "prerm", "postrm")


def project_version() -> str:
    """The version in pyproject.toml, the one the wheel and the package both carry."""
    with open(REPO / "pyproject.toml", "rb") as fh:
        return str(tomllib.load(fh)["project"]["version"])


def run(argv: list[str], **kw) -> None:
    """Run one build step; a failure stops the build with the step's own output."""
    subprocess.run(argv, check=True, **kw)


# What a checkout holds besides its sources: build outputs, environments, caches.
NOT_SOURCES = shutil.ignore_patterns(".git", "build", ".venv", "*.egg-info", "__pycache__", ".state", ".*_cache",
                                     ".hypothesis")


def build_wheels(wheelhouse: Path) -> None:
    """The project and all its runtime dependencies as wheels (from the configured index or cache).

    Built from a copy of the sources, not the checkout itself: setuptools stages a build in the tree's build/lib
    and never removes what an earlier build left there, so a module since moved out of the package (the simulator,
    once agent/sim) would ship again from a stale build/.
    """
    with tempfile.TemporaryDirectory(prefix="supernode-src-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(REPO, src, ignore=NOT_SOURCES)
        run([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheelhouse), str(src)])


def build_venv(stage: Path, wheelhouse: Path) -> Path:
    """A venv of Debian's python3 at stage/opt/supernode-agent, the project installed offline from wheels."""
    venv = stage / PREFIX.relative_to("/")
    run([TARGET_PYTHON, "-m", "venv", "--without-pip", str(venv)])
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
         "--no-index", "--find-links", str(wheelhouse), "--no-compile", "--no-warn-script-location",
         "supernode-agent"])
    relocate(venv)
    # Bytecode compiled for the final path, so tracebacks name /opt/..., and nothing is written at run time:
    # plain for the operator's commands, optimisation level 2 for the daemon (the unit's PYTHONOPTIMIZE=2).
    run([str(venv / "bin" / "python"), "-m", "compileall", "-q", "-j", "0", "-o", "0", "-o", "2",
         "-s", str(stage), "-p", "/", str(venv / "lib")])
    return venv


def relocate(venv: Path) -> None:
    """Rewrite the staging path to /opt/supernode-agent wherever the venv recorded it."""
    old, new = str(venv).encode(), str(PREFIX).encode()
    candidates = [venv / "pyvenv.cfg", *[p for p in (venv / "bin").iterdir() if p.is_file() and not p.is_symlink()]]
    for path in candidates:
        data = path.read_bytes()
        if old in data:
            path.write_bytes(data.replace(old, new))
    leftover = [str(p) for p in candidates if old in p.read_bytes()]
    if leftover:
        raise SystemExit(f"build_deb: staging path left in {leftover}")


def stage_files(stage: Path) -> None:
    """The unit, the example config and the operator's symlink."""
    unit_dir = stage / UNIT_DIR.relative_to("/")
    unit_dir.mkdir(parents=True)
    unit = (REPO / "systemd" / "supernode-agent.service").read_text()
    exe = str(PREFIX / "bin" / "supernode-agent")
    if f"ExecStart={exe} " not in unit:
        raise SystemExit(f"build_deb: systemd/supernode-agent.service must run {exe}")
    (unit_dir / "supernode-agent.service").write_text(unit)
    os.chmod(unit_dir / "supernode-agent.service", 0o644)
    etc = stage / ETC.relative_to("/")
    etc.mkdir(parents=True)
    os.chmod(etc, 0o750)
    shutil.copyfile(REPO / "examples" / "agent.yaml", etc / "agent.yaml")
    os.chmod(etc / "agent.yaml", 0o640)
    bindir = stage / "usr" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "supernode-agent").symlink_to(exe)


def stage_control(stage: Path, version: str) -> None:
    """DEBIAN/: control (with the installed size), conffiles and the maintainer scripts."""
    src = REPO / "packaging" / "debian"
    control_dir = stage / "DEBIAN"
    control_dir.mkdir()
    size_kib = sum(p.lstat().st_size for p in stage.rglob("*") if p.is_file() or p.is_symlink()) // 1024
    control = (src / "control.in").read_text().replace("@VERSION@", version)
    (control_dir / "control").write_text(control.rstrip("\n") + f"\nInstalled-Size: {size_kib}\n")
    shutil.copyfile(src / "conffiles", control_dir / "conffiles")
    for name in SCRIPTS:
        shutil.copyfile(src / name, control_dir / name)
        os.chmod(control_dir / name, 0o755)


def build(out_dir: Path, wheelhouse: Path | None = None) -> Path:
    """Build the .deb into out_dir and return its path."""
    version = project_version()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="supernode-deb-") as tmp:
        tmpdir = Path(tmp)
        if wheelhouse is None:
            wheelhouse = tmpdir / "wheels"
            build_wheels(wheelhouse)
        stage = tmpdir / "root"
        stage.mkdir(mode=0o755)
        build_venv(stage, wheelhouse)
        stage_files(stage)
        stage_control(stage, version)
        deb = out_dir / f"supernode-agent_{version}_amd64.deb"
        run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(stage), str(deb)],
            stdout=subprocess.DEVNULL)
    return deb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "build"), help="directory for the .deb (default %(default)s)")
    ap.add_argument("--wheelhouse", help="use these wheels instead of running `pip wheel` (offline builds)")
    args = ap.parse_args(argv)
    deb = build(Path(args.out), Path(args.wheelhouse) if args.wheelhouse else None)
    print(deb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
