"""The UI's side of security, in a real browser: another site cannot change the broker
through the visitor's browser, and the login form's credentials go with every call."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.ui.helpers import css, fill, text_of, wait_for
from tests.ui.standin import open_standin

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def test_another_site_cannot_change_the_broker(driver: Any, broker: BrokerProcess) -> None:
    status, _ = broker.request("PUT", "/queues/victim", {})
    assert status in (200, 201)
    target = f"{broker.url}/exchanges/amq.default/publish?routing_key=victim"
    with open_standin() as site:
        # a script's request (no-cors: it cannot read the answer, but it is sent) and a
        # plain form, the two ways a page can send a POST to another site
        site.pages["/evil.html"] = f"""<!doctype html><title>evil</title>
            <form id="f" method="POST" action="{target}" enctype="text/plain">
            <input name="forged" value="by form"></form>
            <script>
            fetch("{target}", {{method: "POST", mode: "no-cors", body: "forged by fetch"}})
              .finally(() => {{ document.title = "fetched"; document.getElementById("f").submit(); }});
            </script>""".encode()
        driver.get(site.url + "/evil.html")
        wait_for(driver, lambda d: d.current_url.startswith(broker.url), "the form's answer")
        assert "cross_site_request" in css(driver, "body").text
    status, info = broker.request("GET", "/queues/victim")
    assert info["messages_ready"] == 0 and info["message_stats"]["published"] == 0


def test_login_form_credentials_go_with_every_call(driver: Any) -> None:
    with open_standin() as server:
        expected = "Basic " + base64.b64encode("ops:s3cret é".encode()).decode()
        server.accepted.add(expected)
        driver.get(server.url + "/ui/#/")
        wait_for(driver, lambda d: css(d, "#login").is_displayed(), "the login form")
        assert "log in" in text_of(driver, "#login-reason")
        # Cancel: the page stops asking (the sampler's next calls just fail) until
        # the user presses Log in.
        css(driver, "#login-form button[value=cancel]").click()
        wait_for(driver, lambda d: css(d, "#login-button").is_displayed(), "the Log in button")
        seen = len(server.calls)
        wait_for(driver, lambda d: len(server.calls) >= seen + 2, "more calls")
        assert not css(driver, "#login").is_displayed()
        css(driver, "#login-button").click()
        wait_for(driver, lambda d: css(d, "#login").is_displayed(), "the login form again")
        fill(driver, "#login-user", "ops")
        fill(driver, "#login-password", "s3cret é")
        css(driver, "#login-form button[value=login]").click()
        wait_for(driver, lambda d: text_of(d, "[data-key=version]") == "9.9.9", "the overview")
        assert driver.execute_script("return sessionStorage.getItem('ackbus.authorization')") == expected
        assert css(driver, "#logout").is_displayed()
        # every later call carries it; none went out with anything else once given
        wait_for(driver, lambda d: len([c for c in server.calls if c[1] == expected]) >= 2, "more calls")
        first = next(i for i, c in enumerate(server.calls) if c[1] == expected)
        assert all(auth == expected for _, auth in server.calls[first:])
        # Log out forgets it: the form comes back
        css(driver, "#logout").click()
        wait_for(driver, lambda d: css(d, "#login").is_displayed(), "the login form again")
        assert driver.execute_script("return sessionStorage.getItem('ackbus.authorization')") is None
        # a token works too (Bearer)
        server.accepted.add("Bearer tok-123")
        fill(driver, "#login-token", "tok-123")
        css(driver, "#login-form button[value=login]").click()
        wait_for(driver, lambda d: text_of(d, "[data-key=version]") == "9.9.9", "the overview")
        assert server.calls[-1][1] == "Bearer tok-123"
        driver.execute_script("sessionStorage.clear()")


def test_optional_sections_appear_when_the_broker_has_them(driver: Any) -> None:
    """Locks, schedules and users are shown only by a broker whose API answers them."""
    with open_standin() as server:
        server.accepted.add("Bearer t")
        server.answers["/locks"] = {"locks": [{"name": "nightly-report", "owner": "worker-1", "token": 7}]}
        server.answers["/whoami"] = {"name": "ops", "tags": ["administrator"], "authenticated": True}
        driver.get(server.url + "/ui/#/")
        driver.execute_script("sessionStorage.setItem('ackbus.authorization', 'Bearer t')")
        driver.refresh()
        wait_for(driver, lambda d: css(d, "#nav [data-feature='/locks']").is_displayed(), "the Locks link")
        wait_for(driver, lambda d: "ops" in text_of(d, "#server"), "the user's name")
        assert not css(driver, "#nav [data-feature='/schedules']").is_displayed()
        assert not css(driver, "#nav [data-feature='/users']").is_displayed()
        css(driver, "#nav a[href='#/locks']").click()
        wait_for(driver, lambda d: "nightly-report" in text_of(d, "main table"), "the lock")
        assert "worker-1" in text_of(driver, "main table")
        driver.execute_script("sessionStorage.clear()")


def test_a_broker_with_users_serves_the_page_and_its_login_reaches_the_api(driver: Any, tmp_path: Path) -> None:
    """Against the real authenticator: the page loads without credentials, the API
    answers 401 until the login form is filled, then the queue list shows what the
    user may see, and a declare through the page is done as that user."""
    data = tmp_path / "data"
    made = subprocess.run(
        [sys.executable, "-m", "broker", "users", "--data-dir", str(data), "add", "ops", "--tags", "administrator",
         "--configure", ".*", "--write", ".*", "--read", ".*", "--password-stdin"],
        input="s3cret\n", capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=str(ROOT),
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    creds = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}
    with BrokerProcess(data) as broker:
        assert broker.request("GET", "/queues")[0] == 401
        assert broker.request("PUT", "/queues/billing", {}, headers=creds)[0] == 201
        driver.get(f"{broker.url}/ui/#/queues")
        wait_for(driver, lambda d: css(d, "#login").is_displayed(), "the login form")
        fill(driver, "#login-user", "ops")
        fill(driver, "#login-password", "s3cret")
        css(driver, "#login-form button[value=login]").click()
        wait_for(driver, lambda d: "billing" in text_of(d, "main"), "the queue list")
        wait_for(driver, lambda d: "ops" in text_of(d, "#server"), "the user's name")
        driver.execute_script("sessionStorage.clear()")
