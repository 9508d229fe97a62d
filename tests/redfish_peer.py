"""DMTF's Redfish mockups served by OpenStack's `sushy-static` over HTTPS, for the Redfish client's tests."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.helpers import REPO, free_port, require_binary, wait_for
from tests.peers import stop
from tests.pki import server_pki

MOCKUPS = REPO / "tests" / "fixtures" / "redfish"


def sushy_static_binary() -> str:
    """The venv's sushy-static (installed with the test extras), else one on PATH."""
    local = Path(sys.executable).with_name("sushy-static")
    return str(local) if local.exists() else require_binary("sushy-static")


def copy_mockup(name: str, dest: Path) -> Path:
    """A writable copy of a mockup, for tests that change what the service answers (sushy-static reads per request)."""
    out = dest / name
    shutil.copytree(MOCKUPS / name, out)
    return out


def edit_resource(mockup: Path, uri: str, **changes) -> None:
    """Change one resource of a mockup copy (a value None removes the property); sushy-static serves it at once."""
    path = mockup / uri.removeprefix("/redfish/v1").strip("/") / "index.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


@contextmanager
def sushy_static(mockup: Path, workdir: Path) -> Iterator[dict]:
    """sushy-static serving `mockup` on 127.0.0.1 over HTTPS; yields url, ca, pin and the pki paths."""
    pki = server_pki(workdir, "sushy")
    port = free_port()
    log = open(workdir / f"sushy-{port}.log", "wb")
    proc = subprocess.Popen([sushy_static_binary(), "-i", "127.0.0.1", "-p", str(port), "-m", str(mockup),
                             "-c", str(pki["cert"]), "-k", str(pki["key"])], stdout=log, stderr=log)
    url = f"https://127.0.0.1:{port}"
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"sushy-static exited: {(workdir / f'sushy-{port}.log').read_text()}")
        try:
            with urllib.request.urlopen(url + "/redfish/v1/", timeout=2, context=ctx) as resp:
                return resp.status in (200, 404)
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    try:
        wait_for(ready, 30, interval=0.1, what="sushy-static answering")
        yield {"url": url, **pki}
    finally:
        stop(proc)
        log.close()
