"""Benchmark: one PDU poll (simulated Raritan PX3, 1 inlet, 3 poles, 24 outlets) vs prometheus-snmp-exporter.

Both poll the same simulated device (its own process, so CPU figures are
the poller's own) for the same four value columns with max-repetitions 10.
Prints medians of wall time, CPU time and SNMP requests per poll, and the
wall-time ratio ours / snmp_exporter. Run: .venv/bin/python bench/bench_snmp.py [runs]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporters.power.pdu import PduSource  # noqa: E402
from exporters.snmp.client import SnmpCredentials  # noqa: E402
from exporters.snmp.profile import load_profile  # noqa: E402
from sim.ports import free_port  # noqa: E402

SIM = r"""
import asyncio, sys
from sim.rack import RackModel
from sim.snmp_pdu import SimulatedRaritanPdu
async def main():
    m = RackModel(nodes=8, gpus_per_node=4)
    d = SimulatedRaritanPdu(m, outlets=24)
    await d.start()
    print(d.endpoint[1], flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        print(d.agent.requests, flush=True)
asyncio.run(main())
"""


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def exporter_config(columns: list[str]) -> str:
    lines = ["raritan:", "  version: 2", "  max_repetitions: 10", "  retries: 0", "  timeout: 2s",
             "  auth:", "    community: public", "  walk:"]
    lines += [f"  - {c}" for c in columns]
    lines.append("  metrics:")
    for i, c in enumerate(columns):
        parts = 4 if ".5.2.4." in c else 3
        lines += [f"  - name: col{i}", f"    oid: {c}", "    type: gauge", f"    help: column {c}", "    indexes:"]
        for k in range(parts):
            lines += [f"    - labelname: i{k}", "      type: gauge"]
    return "\n".join(lines) + "\n"


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    sim = subprocess.Popen([sys.executable, "-c", SIM], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = int(sim.stdout.readline())

    def sim_requests() -> int:
        sim.stdin.write("count\n")
        sim.stdin.flush()
        return int(sim.stdout.readline())

    profile = load_profile("raritan-pdu2")
    fast = [o for _, _, o in profile.walked_columns(slow=False)]
    ours_wall, ours_cpu, ours_req = [], [], []

    async def ours() -> None:
        src = PduSource("pdu-a", profile, ("127.0.0.1", port), SnmpCredentials(community="public"),
                        timeout=2.0, retries=0, max_repetitions=10)
        t = time.perf_counter()
        r0 = src.requests
        await src.poll()  # cold: walks scale columns and identity as well
        print(f"ours cold poll ({len(profile.walked_columns())} columns + identity): "
              f"{1000 * (time.perf_counter() - t):.1f} ms, "
              f"{src.requests - r0} requests")
        for _ in range(runs):
            r0, c0, t0 = src.requests, time.process_time(), time.perf_counter()
            await src.poll()
            ours_wall.append(time.perf_counter() - t0)
            ours_cpu.append(time.process_time() - c0)
            ours_req.append(src.requests - r0)
        await src.close()

    asyncio.run(ours())

    exe = shutil.which("prometheus-snmp-exporter")
    go_wall, go_cpu, go_req = [], [], []
    if exe:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = Path(tmp) / "snmp.yml"
            cfg.write_text(exporter_config(fast))
            hport = free_port()
            proc = subprocess.Popen([exe, f"--config.file={cfg}", f"--web.listen-address=127.0.0.1:{hport}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            url = f"http://127.0.0.1:{hport}/snmp?module=raritan&target=127.0.0.1:{port}"
            try:
                deadline = time.monotonic() + 10
                while True:
                    try:
                        body = urllib.request.urlopen(url, timeout=5).read().decode()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
                assert "col0" in body, body[:500]
                for _ in range(runs):
                    r0, c0, t0 = sim_requests(), cpu_of(proc.pid), time.perf_counter()
                    urllib.request.urlopen(url, timeout=5).read()
                    go_wall.append(time.perf_counter() - t0)
                    go_cpu.append(cpu_of(proc.pid) - c0)
                    go_req.append(sim_requests() - r0)
            finally:
                proc.terminate()
                proc.wait(timeout=10)
    sim.stdin.close()
    sim.terminate()
    sim.wait(timeout=10)

    med = statistics.median
    print(f"device: simulated Raritan PX3, 1 inlet, 3 poles, 24 outlets; columns: {len(fast)}; runs: {runs}")
    print(f"ours (steady state):           wall {1000 * med(ours_wall):.1f} ms, cpu {1000 * med(ours_cpu):.1f} ms, "
          f"requests {med(ours_req):.0f}")
    if go_wall:
        print(f"prometheus-snmp-exporter:      wall {1000 * med(go_wall):.1f} ms, cpu {1000 * med(go_cpu):.1f} ms "
              f"(clock-tick resolution), requests {med(go_req):.0f}")
        print(f"wall-time ratio ours / snmp_exporter: {med(ours_wall) / med(go_wall):.2f}")
    else:
        print("prometheus-snmp-exporter not installed: no comparison")


if __name__ == "__main__":
    main()
