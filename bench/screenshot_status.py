"""The README's picture of the status page during the demo's leak story (`make screenshot`).

The demo's rack and agents (tests/statusrack.py: the same configs as `make demo`), a leak injected in
zone-a, node01's page in headless Chromium with the admin token, once the page shows the wet zone, the
capped GPUs and the valve close waiting for approval: the top of the page, at 1100 x 1900 CSS pixels.

    python bench/screenshot_status.py [OUT.png]      # default docs/status-page-leak.png

When Debian's pngquant is installed, the picture is reduced to 256 colours (a third of the bytes; text and
badges stay sharp); without it the PNG is kept as Chromium wrote it.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

from tests.browser import chromium  # noqa: E402
from tests.statusrack import TOKEN, status_rack  # noqa: E402

WIDTH, HEIGHT = 1100, 1900


def _until(driver, script: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not driver.execute_script(script):
        if time.monotonic() > deadline:
            raise TimeoutError(script)
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else REPO / "docs" / "status-page-leak.png"
    with tempfile.TemporaryDirectory(prefix="status-shot-") as tmp, status_rack(Path(tmp)) as rs:
        d = chromium(WIDTH, 1000)
        try:
            d.get(rs.agents["node01"].url + "/")
            d.find_element("id", "token").send_keys(TOKEN)
            d.find_element("css selector", "#token-form button[type=submit]").click()
            _until(d, "return document.getElementById('token-note').textContent.includes('Incidents visible')")
            rs.rack.inject("leak", zone="zone-a")
            _until(d, "return document.querySelector('[data-zone=\"zone-a\"][data-state=wet]')"
                      " && document.querySelector('#pending button[data-approve]')"
                      " && document.querySelectorAll('[data-node=node01] .badge.warn').length >= 4"
                      " && document.querySelector('[data-node=node02] .badge.ok')")
            time.sleep(1.5)  # one more update: every step's result drawn
            shot = d.execute_cdp_cmd("Page.captureScreenshot", {
                "format": "png", "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": WIDTH, "height": HEIGHT, "scale": 1}})
        finally:
            d.quit()
    out.write_bytes(base64.b64decode(shot["data"]))
    pngquant = shutil.which("pngquant")
    if pngquant:
        subprocess.run([pngquant, "--force", "--skip-if-larger", "--strip", "--output", str(out), "256", "--", str(out)],
                       check=False, timeout=60)
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB{', pngquant' if pngquant else ''})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
