"""Small Selenium helpers of the browser tests: waits for a condition on the page
(never fixed sleeps), element text, form filling, console errors, unlabelled inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.broker import BrokerProcess

WAIT_S = 15.0


def wait_for(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(condition, message=f"waiting for {what}")


def css(driver: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def text_of(driver: Any, selector: str) -> str:
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
    )

    try:
        return str(css(driver, selector).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def wait_text(driver: Any, selector: str, expected: str) -> None:
    wait_for(driver, lambda d: expected in text_of(d, selector), f"{expected!r} in {selector}")


def click(driver: Any, selector: str) -> None:
    """Click ``selector``, finding it again if the page re-rendered it between the
    find and the click (a list refreshed by its poll)."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
    )

    def clicked(d: Any) -> bool:
        try:
            css(d, selector).click()
        except (NoSuchElementException, StaleElementReferenceException):
            return False
        return True

    wait_for(driver, clicked, f"a click on {selector}")


def fill(driver: Any, selector: str, value: str) -> None:
    el = css(driver, selector)
    el.clear()
    el.send_keys(value)


def open_page(driver: Any, broker: BrokerProcess, page: str) -> None:
    driver.get(f"{broker.url}/ui/{page}")
    wait_for(driver, lambda d: d.execute_script("return !!document.querySelector('main h1')"), "the page")


def console_errors(driver: Any) -> list[str]:
    """Console errors, but the expected 404s of optional APIs the nav probes for."""
    out = []
    for entry in driver.get_log("browser"):
        if entry["level"] != "SEVERE":
            continue
        message = entry["message"]
        if "404" in message and any(p in message for p in ("/locks ", "/schedules ", "/users ", "/whoami ")):
            continue
        out.append(message)
    return out


def unlabelled_controls(driver: Any) -> list[str]:
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll('main input, main select, main textarea')]"
            ".filter(e => !e.labels || !e.labels.length).map(e => e.name || e.outerHTML)"
        )
    )
