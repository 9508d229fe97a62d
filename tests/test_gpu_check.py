"""bench/gpu_check.py, the read-only check a session lent a GPU machine runs, proven here against the twin.

A GPU session has a few minutes of device time: the script must work the first time it meets a real
driver, with only the standard library and the dependencies `--write-deps` copies, and must never
change the GPU. So it runs here as it would there (`python -S`: no site-packages but those copies),
against a twin built from a real H200 capture.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from sim.nvml_twin import NvmlTwin
from sim.nvml_capture import model_from_capture
from tests.nvml_sim import NvmlSimServer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from gpu_check import READING_CALLS, ReadOnlyNvml  # noqa: E402

CAPTURE = REPO / "tests" / "fixtures" / "nvidia-smi" / "h200-550.90.12.nvidia-smi-q.txt"
# a verb that writes, as a word of a CamelCase name ("Settings" and "Enabled" are not verbs)
MUTATING = re.compile(r"(Set|Clear|Reset|Create|Destroy|Modify|Remove|Freeze|Enable|Disable|Validate|Activate|Update)"
                      r"(?=[A-Z_0-9]|$)")


@pytest.fixture(scope="module")
def twin_server():
    srv = NvmlSimServer(model_from_capture(CAPTURE.read_text(), "node01")).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def deps(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("gpu-deps")
    subprocess.run([sys.executable, "bench/gpu_check.py", "--write-deps", str(dest)], cwd=REPO, check=True,
                   capture_output=True, timeout=60)
    return dest


def _check(deps: Path, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run([sys.executable, "-S", "bench/gpu_check.py", "--deps", str(deps), "--out", str(out),
                           "--cycles", "3", "--reps", "3", *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    return done, summary


def test_no_call_that_changes_a_gpu_gets_through(twin_server):
    lib = ReadOnlyNvml(NvmlTwin(twin_server.url, "node01"))
    lib.nvmlInit()
    h = lib.nvmlDeviceGetHandleByIndex(0)
    limit = lib.nvmlDeviceGetPowerManagementLimit(h)
    for name, args in (("nvmlDeviceSetPowerManagementLimit", (h, limit - 100_000)),
                       ("nvmlDeviceClearFieldValues", (h, [pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL])),
                       ("nvmlDeviceResetGpuLockedClocks", (h,)), ("nvmlDeviceSetPersistenceMode", (h, 0))):
        with pytest.raises(PermissionError, match=name):
            getattr(lib, name)(*args)
    assert lib.nvmlDeviceGetPowerManagementLimit(h) == limit  # the twin's limit never moved
    assert lib.refused == ["nvmlDeviceSetPowerManagementLimit", "nvmlDeviceClearFieldValues",
                           "nvmlDeviceResetGpuLockedClocks", "nvmlDeviceSetPersistenceMode"]
    assert lib.NVML_SUCCESS == pynvml.NVML_SUCCESS and lib.NVMLError is pynvml.NVMLError  # constants pass
    lib.nvmlShutdown()


def test_the_allowlist_lets_through_no_pynvml_function_that_writes():
    """Every pynvml function READING_CALLS admits reads (event sets aside); a new writer would fail here."""
    admitted = [n for n in dir(pynvml) if n.startswith(READING_CALLS) and callable(getattr(pynvml, n))]
    assert "nvmlDeviceGetFieldValues" in admitted and "nvmlDeviceGetNvLinkState" in admitted
    verbs = {n: MUTATING.findall(n.removeprefix("nvmlEventSet").removeprefix("nvmlDeviceGet")
                                 .removeprefix("nvmlSystemGet").removeprefix("nvmlUnitGet"))
             for n in admitted if n != "nvmlDeviceRegisterEvents"}
    # the event set's own life cycle, and a noun: the set of GPUs at a topology level
    assert {n: v for n, v in verbs.items() if v} == {"nvmlEventSetCreate": ["Create"],
                                                     "nvmlSystemGetTopologyGpuSet": ["Set"]}
    refused = [n for n in dir(pynvml) if n.startswith("nvml") and callable(getattr(pynvml, n)) and n not in admitted]
    assert "nvmlDeviceSetPowerManagementLimit" in refused and "nvmlDeviceClearEccErrorCounts" in refused


def test_the_check_runs_on_the_standard_library_and_its_copied_dependencies(twin_server, deps, tmp_path):
    done, summary = _check(deps, tmp_path, "--sim-url", twin_server.url, "--capture", str(CAPTURE))
    assert done.returncode == 0, done.stdout + done.stderr
    gpu = summary["environment"]["gpus"][0]
    assert gpu["uuid"] == "GPU-cb3dfa52-e2f3-9ca4-a399-7d16041c3732" and gpu["name"] == "NVIDIA H200"
    assert summary["environment"]["nvidia_ml_py"] == pynvml_version()  # the copied .dist-info says which
    (state,) = summary["nvlink_state"]
    assert [x["call"] for x in state["links"]] == [1] * 18 and [x["field"] for x in state["links"]] == [1] * 18
    assert state["disagree"] == [] and state["cost"]["field_batch"]["cpu_ms"] > 0
    exporter = summary["exporter"]
    assert exporter["series"] == sum(exporter["families"].values()) > 0 and exporter["partial_errors"] == {}
    assert exporter["families"]["supernode_nvlink_up"] == 18 and exporter["poll_cpu_ms"] > 0
    assert 'supernode_gpu_info{' in (tmp_path / "probe.prom").read_text()
    (versus,) = summary["versus_nvidia_smi"]
    assert versus["disagree"] == [] and len(versus["static"]) == 13  # the R550 capture prints no recovery action
    assert versus["static"]["power_limit_default_w"] == {"exporter": 700.0, "nvidia_smi": 700.0, "agree": True}
    assert summary["refused_calls"] == [] and summary["peer"] == {
        "skipped": f"nvidia-smi not run: compared with {CAPTURE.name}"}
    assert "versus nvidia-smi gpu 0: static facts agree 13/13, disagree: none" in done.stdout


def test_a_fact_the_exporter_reads_differently_from_nvidia_smi_is_named(twin_server, deps, tmp_path):
    text = CAPTURE.read_text()
    other = re.sub(r"(Default Power Limit\s+: )700\.00 W", r"\g<1>650.00 W", text, count=1)
    assert other != text
    capture = tmp_path / "other.txt"
    capture.write_text(other)
    done, summary = _check(deps, tmp_path / "out", "--sim-url", twin_server.url, "--capture", str(capture))
    assert done.returncode == 0, done.stdout + done.stderr
    (versus,) = summary["versus_nvidia_smi"]
    assert versus["disagree"] == ["power_limit_default_w"]
    assert versus["static"]["power_limit_default_w"] == {"exporter": 700.0, "nvidia_smi": 650.0, "agree": False}


def test_no_driver_is_reported_and_fails_the_run(deps, tmp_path):
    from tests.helpers import free_port

    done, summary = _check(deps, tmp_path, "--sim-url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert summary["nvml_init"]["error"].startswith("NVMLError_DriverNotLoaded")
    assert summary["exporter"] == {"error": "not run: nvmlInit failed"} and "environment" not in summary


def pynvml_version() -> str:
    from importlib.metadata import version

    return version("nvidia-ml-py")
