"""A real browser for the management UI tests: headless Chromium driven by Selenium.

The tests run whenever a browser is here and skip, saying why, when it is not
(``scripts/test -ra`` lists the reason; ``.ci/run`` installs Debian's ``chromium``
and ``chromium-driver`` first, so CI always runs them). The browser and driver are
found on the PATH (``chromium``, ``chromedriver``) or named by ``ACKBUS_CHROMIUM`` and
``ACKBUS_CHROMEDRIVER``.

Screenshots of each page are saved under the test's temporary directory, and also
into the directory named by ``ACKBUS_UI_SCREENSHOTS`` when it is set
(``ACKBUS_UI_SCREENSHOTS=docs/ui scripts/test tests/ui`` refreshes the pictures of
docs/ui.md).
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerProcess

ROOT = Path(__file__).resolve().parents[2]


def _find(env: str, names: tuple[str, ...]) -> str | None:
    given = os.environ.get(env)
    if given:
        return given if os.access(given, os.X_OK) else None
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def _browser() -> tuple[str, str]:
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("UI browser tests need selenium (pip install -e '.[test]')")
    chromium = _find("ACKBUS_CHROMIUM", ("chromium", "chromium-browser", "google-chrome"))
    driver = _find("ACKBUS_CHROMEDRIVER", ("chromedriver",))
    if chromium is None or driver is None:
        missing = " and ".join(n for n, p in (("chromium", chromium), ("chromedriver", driver)) if p is None)
        pytest.skip(
            f"UI browser tests skipped: no {missing} found "
            "(apt-get install chromium chromium-driver, or set ACKBUS_CHROMIUM / ACKBUS_CHROMEDRIVER)"
        )
    return chromium, driver


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker subprocess with a data directory (so the overview shows the log)."""
    _browser()  # skip before starting anything
    with BrokerProcess(tmp_path_factory.mktemp("ui-broker") / "data") as proc:
        yield proc


@pytest.fixture(scope="session")
def driver() -> Iterator[Any]:
    """One headless Chromium for all the browser tests."""
    chromium, chromedriver = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        yield browser
    finally:
        browser.quit()


class Screenshots:
    """Saves full-width screenshots into the test's directory, and into
    ``ACKBUS_UI_SCREENSHOTS`` when it is set."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        target = os.environ.get("ACKBUS_UI_SCREENSHOTS")
        self.publish_to = (ROOT / target if not os.path.isabs(target) else Path(target)) if target else None

    def take(self, driver: Any, name: str) -> Path:
        """The whole page, not only the window (Chromium's DevTools screenshot)."""
        path = self.directory / f"{name}.png"
        driver.execute_script("window.scrollTo(0, 0); document.activeElement && document.activeElement.blur()")
        width, height = driver.execute_script(
            "return [document.documentElement.clientWidth, document.documentElement.scrollHeight]"
        )
        shot = driver.execute_cdp_cmd(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": min(height, 4000), "scale": 1},
            },
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        if self.publish_to is not None:
            self.publish_to.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, self.publish_to / path.name)
        return path


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Screenshots:
    return Screenshots(tmp_path_factory.mktemp("ui-screenshots"))
