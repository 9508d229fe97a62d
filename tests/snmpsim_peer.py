"""snmpsim as a real SNMP peer: serves the recordings of tests/fixtures/recordings on a free 127.0.0.1 UDP port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import free_port, recording, require_binary, wait_for

V3_USER, V3_AUTH, V3_PRIV = "agentv3", "auth-key-0123", "priv-key-4567"


def snmpsim_binary() -> str:
    """snmpsim-command-responder from the project venv (next to sys.executable), else PATH."""
    local = Path(sys.executable).parent / "snmpsim-command-responder"
    if local.exists():
        return str(local)
    return require_binary("snmpsim-command-responder")


def _answers(port: int, community: str) -> bool:
    # A tiny hand-made v2c GET of sysDescr.0 (no client library involved in readiness).
    from pyasn1.codec.ber import encoder
    from pysnmp.proto import api
    p = api.PROTOCOL_MODULES[api.SNMP_VERSION_2C]
    pdu = p.GetRequestPDU()
    p.apiPDU.set_defaults(pdu)
    p.apiPDU.set_varbinds(pdu, [((1, 3, 6, 1, 2, 1, 1, 1, 0), p.Null(""))])
    msg = p.Message()
    p.apiMessage.set_defaults(msg)
    p.apiMessage.set_community(msg, community)
    p.apiMessage.set_pdu(msg, pdu)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.3)
        s.sendto(encoder.encode(msg), ("127.0.0.1", port))
        try:
            return bool(s.recv(65535))
        except OSError:
            return False


def run_snmpsim(workdir: Path, data_dirs: list[Path], probe_community: str) -> Iterator[int]:
    binary = snmpsim_binary()
    port = free_port(socket.SOCK_DGRAM)  # outside the ephemeral range, in this worker's slice
    log = open(workdir / "snmpsim.log", "w")
    argv = [binary, *(f"--data-dir={d}" for d in data_dirs), f"--cache-dir={workdir / 'cache'}",
            f"--agent-udpv4-endpoint=127.0.0.1:{port}", "--logging-method=stdout",
            f"--v3-user={V3_USER}", "--v3-auth-proto=SHA", f"--v3-auth-key={V3_AUTH}",
            "--v3-priv-proto=AES", f"--v3-priv-key={V3_PRIV}"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "SNMPSIM_ALLOW_ROOT": "true"})
    try:
        wait_for(lambda: proc.poll() is not None or _answers(port, probe_community), timeout=30,
                 what="snmpsim to answer")
        if proc.poll() is not None:
            pytest.fail(f"snmpsim exited: {(workdir / 'snmpsim.log').read_text()[-2000:]}")
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def recordings() -> list[Path]:
    """The recording folders, read in place (community = file stem: apc-8641, apc-7902b, raritan-pdu2,
    vertiv-pdu_mn03edr1, vertiv-pdu_mg02e4w1, and the crafted recordings of crafted/README.md)."""
    return [recording("snmprec/apc-8641.snmprec").parent, recording("snmpwalk/raritan-pdu2.snmpwalk").parent,
            recording("librenms/vertiv-pdu_mn03edr1.snmprec").parent, recording("crafted/README.md").parent]
