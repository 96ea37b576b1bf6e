"""A real headless Chromium (Debian's ``chromium`` + ``chromium-driver``) driven by selenium, for
the tests that render the HTML report and the sidecar page."""

from __future__ import annotations

import os
import shutil

import pytest


def chromium_paths() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def headless_chromium(width: int = 1280, height: int = 1600):
    """A selenium WebDriver on headless Chromium; skips the test when Chromium is absent (it is
    installed by .ci/apt-packages.txt in CI)."""
    paths = chromium_paths()
    if paths is None:
        pytest.skip("chromium / chromedriver not installed (.ci/apt-packages.txt)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = paths[0]
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={width},{height}", "--no-first-run", "--disable-extensions"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(paths[1], log_output=os.devnull), options=opts)
