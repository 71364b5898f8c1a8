"""The management UI as a RabbitMQ user expects it, in a real browser: charts that
start with the broker's history, memory/disk/descriptor health and the memory alarm,
badges for queue arguments, ISO 8601 dates, dead letters counted as arrivals,
exchange message rates, and users, permissions and tokens edited from the page.

Waits are for a condition on the page, never fixed sleeps.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.ui.conftest import ROOT, Screenshots
from tests.ui.helpers import (
    click,
    console_errors,
    css,
    fill,
    open_page,
    text_of,
    unlabelled_controls,
    wait_for,
    wait_text,
)

pytestmark = pytest.mark.timeout(120)

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def names(driver: Any, table: str) -> list[str]:
    """The first cells of ``table``'s rows, read in one step (the page may redraw it)."""
    return list(driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
        ".map(r => r.cells.length ? r.cells[0].textContent.trim() : '')", table))


def row_of(driver: Any, table: str, name: str) -> Any:
    """The row of ``table`` whose first cell is ``name`` (None if absent)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(5):  # the page redraws its tables: read again when caught mid-way
        try:
            for row in driver.find_elements("css selector", f"{table} tbody tr"):
                cells = row.find_elements("css selector", "td")
                if cells and cells[0].text.strip() == name:
                    return row
            return None
        except StaleElementReferenceException:
            continue
    return None


def cell(driver: Any, table: str, name: str, col: str) -> str:
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        row = row_of(driver, table, name)
        return "" if row is None else str(row.find_element("css selector", f"td[data-col={col}]").text)
    except StaleElementReferenceException:
        return ""


def test_overview_charts_start_with_history_and_show_resource_health(
    driver: Any, broker: BrokerProcess, screenshots: Screenshots
) -> None:
    # The broker samples every 5 s from its start: wait until it holds a sample older
    # than this page will be when it draws.
    deadline = time.monotonic() + 20
    while True:
        status, history = broker.request("GET", "/overview/history")
        assert status == 200, history
        if history["samples"] and history["now"] - history["samples"][0]["t"] >= 6:
            break
        assert time.monotonic() < deadline, history
        time.sleep(0.2)
    open_page(driver, broker, "#/")
    wait_for(driver, lambda d: text_of(d, "[data-key=fds]") != "", "the health cards")
    # The depth chart reaches further back than the page has existed: the history.
    span, age = driver.execute_script(
        "return [Number(document.querySelectorAll('.chart-svg')[1].dataset.span), performance.now() / 1000]"
    )
    assert span > age + 2, (span, age)
    assert driver.find_elements("css selector", ".chart path.line")
    assert re.match(r"[\d.]+ [KMG]iB / [\d.]+ [KMG]iB \(\d+ %\)", text_of(driver, "[data-key=memory]"))
    assert text_of(driver, "[data-key=memory_alarm]") == "ok"
    assert "of" in text_of(driver, "[data-key=disk_free]")  # the data directory's disk
    assert re.match(r"\d+ of ", text_of(driver, "[data-key=fds]"))
    assert text_of(driver, "#alarm") == ""
    assert console_errors(driver) == []


def test_the_memory_alarm_shows_on_the_overview(driver: Any, tmp_path: Path) -> None:
    # A watermark far below any Python process: the alarm is raised at once.
    with BrokerProcess(tmp_path / "data", args=("--memory-high-watermark", "1MiB")) as tiny:
        open_page(driver, tiny, "#/")
        wait_text(driver, "#alarm", "Publishing is blocked: memory alarm")
        assert text_of(driver, "[data-key=memory_alarm]") == "RAISED"
        status, body = tiny.request("POST", "/exchanges/amq.default/publish?routing_key=q", b"x",
                                    headers={"X-Deadline-Ms": "100"})
        assert status == 503 and body["reason"] == "deadline", body


def test_queue_badges_iso_dates_and_dead_letter_arrivals(
    driver: Any, broker: BrokerProcess, screenshots: Screenshots
) -> None:
    args = {
        "x-message-ttl": 60000, "x-max-length": 1000, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "badge-dlq", "x-max-priority": 5, "x-single-active-consumer": True,
        "x-queue-type": "quorum",
    }
    assert broker.request("PUT", "/queues/badge-dlq", {})[0] in (200, 201)
    assert broker.request("PUT", "/queues/badge-work", {"arguments": args})[0] in (200, 201)
    assert broker.request("POST", "/exchanges/amq.default/publish?routing_key=badge-work", b"poison")[0] == 200
    status, got = broker.request("POST", "/queues/badge-work/get?lease=60")
    lease = got["messages"][0]["lease_id"]
    assert broker.request("POST", "/queues/badge-work/nack", {"lease_ids": [lease], "requeue": False})[0] == 200

    open_page(driver, broker, "#/queues")
    fill(driver, "input[name=filter]", "badge-")
    wait_text(driver, "#queue-list caption", "2 of")
    # read in one step: the list redraws every few seconds
    badges, titles, text = driver.execute_script(
        "const row = [...document.querySelectorAll('#queue-list tbody tr')]"
        ".find(r => r.cells[0].textContent.trim() === 'badge-work');"
        "const tags = [...row.querySelectorAll('.tag')];"
        "return [tags.map(t => t.textContent), tags.map(t => t.title), row.textContent]"
    )
    assert badges == ["D", "Q", "TTL", "Lim", "DLX", "DLK", "Pri", "SAC"], badges
    assert titles[2] == "message TTL 60000 ms"
    assert "x-message-ttl" not in text  # badges, not raw JSON
    screenshots.take(driver, "queue-badges")

    # The dead-letter queue counts its dead letter as an arrival; dates are ISO 8601.
    open_page(driver, broker, "#/queue/badge-dlq")
    wait_text(driver, "#arrived", "1")
    click(driver, "#browse-form button[type=submit]")
    wait_text(driver, "#browsed", "poison")
    dates = ISO.findall(text_of(driver, "#browsed"))
    assert dates, text_of(driver, "#browsed")  # enqueued at, and the x-death time
    open_page(driver, broker, "#/queue/badge-work")
    wait_text(driver, "#queue-arguments", "x-max-priority")
    assert console_errors(driver) == []


def test_exchanges_show_message_rates(driver: Any, broker: BrokerProcess, screenshots: Screenshots) -> None:
    assert broker.request("PUT", "/exchanges/rates-x", {"type": "fanout"})[0] in (200, 201)
    assert broker.request("PUT", "/queues/rates-q", {"durable": False})[0] in (200, 201)
    assert broker.request("POST", "/bindings", {"exchange": "rates-x", "queue": "rates-q"})[0] in (200, 201)
    open_page(driver, broker, "#/exchanges")
    wait_for(driver, lambda d: row_of(d, "#exchange-list", "rates-x") is not None, "the exchange row")

    def publishing(d: Any) -> bool:
        for _ in range(10):
            broker.request("POST", "/exchanges/rates-x/publish", b"m")
        rate_in = cell(d, "#exchange-list", "rates-x", "rate_in")
        return rate_in not in ("", "–") and rate_in != "0.0/s"

    wait_for(driver, publishing, "an in rate")
    assert cell(driver, "#exchange-list", "rates-x", "rate_out") not in ("", "–", "0.0/s")
    status, info = broker.request("GET", "/exchanges/rates-x")
    assert info["message_stats"]["messages_in"] >= 10
    assert info["message_stats"]["messages_out"] == info["message_stats"]["messages_in"]
    screenshots.take(driver, "exchanges")
    assert console_errors(driver) == []


def test_users_permissions_and_tokens_are_edited_from_the_page(
    driver: Any, tmp_path: Path, screenshots: Screenshots
) -> None:
    data = tmp_path / "data"
    made = subprocess.run(
        [sys.executable, "-m", "broker", "users", "--data-dir", str(data), "add", "ops", "--tags", "administrator",
         "--configure", ".*", "--write", ".*", "--read", ".*", "--password-stdin"],
        input="s3cret\n", capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=str(ROOT),
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    admin = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}
    with BrokerProcess(data) as broker:
        driver.get(f"{broker.url}/ui/#/users")
        wait_for(driver, lambda d: css(d, "#login").is_displayed(), "the login form")
        fill(driver, "#login-user", "ops")
        fill(driver, "#login-password", "s3cret")
        click(driver, "#login-form button[value=login]")
        wait_for(driver, lambda d: "ops" in names(d, "#user-list"), "the user list")

        # Add a user with a password and a tag.
        fill(driver, "#user-form input[name=name]", "bob")
        fill(driver, "#user-form input[name=password]", "b0b-pass")
        fill(driver, "#user-form input[name=tags]", "monitoring")
        click(driver, "#user-form button[type=submit]")
        wait_text(driver, "#user-form .status", "User bob saved")
        status, bob = broker.request("GET", "/users/bob", headers=admin)
        assert status == 200 and bob["tags"] == ["monitoring"] and bob["has_password"], bob
        bob_auth = {"Authorization": "Basic " + base64.b64encode(b"bob:b0b-pass").decode()}
        assert broker.request("GET", "/whoami", headers=bob_auth)[0] == 200

        # Set its permissions (Edit fills the forms).
        wait_for(driver, lambda d: "bob" in names(d, "#user-list"), "bob in the list")
        click(driver, "button[aria-label='Edit user bob']")
        assert css(driver, "#permissions-form input[name=user]").get_attribute("value") == "bob"
        fill(driver, "#permissions-form input[name=write]", "^jobs$")
        fill(driver, "#permissions-form input[name=read]", "^jobs$")
        click(driver, "#permissions-form button[type=submit]")
        wait_text(driver, "#permissions-form .status", "Permissions of bob set")
        status, bob = broker.request("GET", "/users/bob", headers=admin)
        assert bob["permissions"] == {"configure": "", "write": "^jobs$", "read": "^jobs$"}, bob

        # Make a token (its secret shown once), then revoke it.
        click(driver, "button[aria-label='Tokens of bob']")
        wait_text(driver, "#tokens", "bob has no tokens")
        fill(driver, "#token-form input[name=description]", "ci")
        click(driver, "#token-form button[type=submit]")
        wait_for(driver, lambda d: text_of(d, "#token-value").startswith("ackbus_"), "the token's secret")
        secret = text_of(driver, "#token-value")
        assert broker.request("GET", "/whoami", headers={"Authorization": f"Bearer {secret}"})[0] == 200
        wait_text(driver, "#token-list", "ci")
        assert ISO.search(text_of(driver, "#token-list"))
        assert unlabelled_controls(driver) == []
        screenshots.take(driver, "users")
        click(driver, "#token-list button.danger")
        wait_for(driver, lambda d: css(d, "#confirm").is_displayed(), "the confirmation dialog")
        click(driver, "#confirm-yes")
        wait_text(driver, "#token-list", "bob has no tokens")
        assert broker.request("GET", "/whoami", headers={"Authorization": f"Bearer {secret}"})[0] == 401

        # Delete the user (confirmed).
        click(driver, "button[aria-label='Delete user bob']")
        wait_for(driver, lambda d: css(d, "#confirm").is_displayed(), "the confirmation dialog")
        click(driver, "#confirm-yes")
        wait_for(driver, lambda d: names(d, "#user-list") == ["ops"], "bob to go")
        assert broker.request("GET", "/users/bob", headers=admin)[0] == 404
        # (the calls answered 401 before the login are expected)
        assert [e for e in console_errors(driver) if "401" not in e] == []
        driver.execute_script("sessionStorage.clear()")
