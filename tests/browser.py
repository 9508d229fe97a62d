"""Debian's Chromium driven by Selenium through Debian's chromedriver: never a downloaded driver or browser.

Headless as root (--no-sandbox), with Chromium's own background traffic off (this machine refuses
outside connections, and a test must see only the page's own requests), a fresh profile per
session, and the browser and DevTools (performance) logs kept for the tests to read.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any
from urllib.parse import urlsplit

from tests.helpers import require_binary

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def chromium(width: int = 1280, height: int = 1000, mobile: bool = False) -> Any:
    """A headless Chromium session; `mobile` emulates a phone of `width` CSS pixels (touch, device scale 3)."""
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never look for a driver on the network
    os.environ.setdefault("SE_AVOID_STATS", "true")
    require_binary("chromium")
    require_binary("chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="supernode-chromium-")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-default-apps", "--disable-extensions", "--mute-audio", f"--user-data-dir={profile}",
                f"--window-size={width},{height}"):
        opts.add_argument(arg)
    if mobile:
        opts.add_experimental_option("mobileEmulation", {"deviceMetrics": {"width": width, "height": height,
                                                                           "pixelRatio": 3.0, "touch": True}})
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def requested_urls(driver: Any) -> list[str]:
    """Every URL the page asked for since the last call, from the DevTools protocol's network events."""
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def outside(urls: list[str], origin: str) -> list[str]:
    """The URLs not on `origin` (scheme://host:port)."""
    want = urlsplit(origin)
    return [u for u in urls if (urlsplit(u).scheme, urlsplit(u).netloc) != (want.scheme, want.netloc)]
