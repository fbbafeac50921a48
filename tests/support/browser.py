"""Debian's chromium, headless, driven by selenium through chromium-driver: the browser tests' one way to start it."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

#: What every browser test passes to chromium (headless, no sandbox in a container, a page tall enough).
ARGS = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1900")


def chromium(*extra_args: str, console_log: bool = False) -> Any:
    """Start headless chromium with ``extra_args``; ``console_log`` keeps the pages' console for ``get_log("browser")``.

    Skips naming the packages when chromium or chromium-driver is missing (scripts/test installs
    both, and with CI=true that skip fails: tests/support/skips.py).
    """
    binary = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip(
            "needs Debian's chromium and chromium-driver: apt-get install chromium chromium-driver (scripts/test does)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (*ARGS, *extra_args):
        options.add_argument(arg)
    if console_log:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    return driver
