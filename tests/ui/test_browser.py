"""The management UI in a real browser (headless Chromium): every action is done
through the page, and then checked through the REST API.

Few and fast: one broker and one browser for the module. Waits are for a condition on
the page (WebDriverWait), never fixed sleeps, and never assertions on how long
something took.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.ui.conftest import Screenshots
from tests.ui.helpers import (
    WAIT_S,
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

def queue(broker: BrokerProcess, name: str) -> dict[str, Any]:
    status, body = broker.request("GET", f"/queues/{name}")
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def test_queue_lifecycle_through_the_ui(driver: Any, broker: BrokerProcess, screenshots: Screenshots) -> None:
    # Declare a queue with the form on the queue list.
    open_page(driver, broker, "#/queues")
    fill(driver, "#declare-queue input[name=name]", "ui-orders")
    css(driver, "#declare-queue button[type=submit]").click()
    wait_text(driver, "#declare-queue .status", "Queue ui-orders declared")
    assert queue(broker, "ui-orders")["durable"] is True

    # The list shows it; its link opens the queue's page.
    wait_for(driver, lambda d: "ui-orders" in text_of(d, "#queue-list"), "the queue in the list")
    from selenium.webdriver.common.by import By

    driver.find_element(By.LINK_TEXT, "ui-orders").click()
    wait_text(driver, "#queue-name", "ui-orders")
    wait_text(driver, "#depth-ready", "0")

    # Publish a test message: the confirm is shown, the depth on the page follows.
    fill(driver, "#publish-form textarea[name=body]", "hello from the browser")
    css(driver, "#publish-form button[type=submit]").click()
    wait_text(driver, "#publish-form .status", "confirm ack, routed to 1 queue(s)")
    assert queue(broker, "ui-orders")["messages_ready"] == 1
    wait_text(driver, "#depth-ready", "1")

    # Browse it without consuming it.
    css(driver, "#browse-form button[type=submit]").click()
    wait_text(driver, "#browsed", "hello from the browser")
    assert "delivery count" in text_of(driver, "#browsed")
    after_browse = queue(broker, "ui-orders")
    assert after_browse["messages_ready"] == 1
    assert after_browse["message_stats"]["delivered"] == 0
    assert unlabelled_controls(driver) == []
    screenshots.take(driver, "queue")

    # Get it on a lease, then nack it back: it is ready again, marked redelivered.
    css(driver, "#get-form button[type=submit]").click()
    wait_text(driver, "#got-messages", "hello from the browser")
    assert queue(broker, "ui-orders")["messages_unacked"] == 1
    [nack] = [b for b in driver.find_elements("css selector", "#got-messages button") if b.text == "Nack, requeue"]
    nack.click()
    wait_text(driver, "#got-messages", "Returned to the queue")
    after_nack = queue(broker, "ui-orders")
    assert (after_nack["messages_ready"], after_nack["messages_unacked"]) == (1, 0)
    assert after_nack["message_stats"]["redelivered"] == 0  # counted when delivered again

    # Purge, through the confirmation dialog (Cancel first: nothing happens).
    css(driver, "#purge").click()
    wait_for(driver, lambda d: css(d, "#confirm").is_displayed(), "the confirmation dialog")
    assert driver.switch_to.active_element.get_attribute("id") == "confirm-no"
    css(driver, "#confirm-no").click()
    wait_for(driver, lambda d: not css(d, "#confirm").is_displayed(), "the dialog to close")
    assert queue(broker, "ui-orders")["messages_ready"] == 1
    css(driver, "#purge").click()
    wait_for(driver, lambda d: css(d, "#confirm").is_displayed(), "the confirmation dialog")
    css(driver, "#confirm-yes").click()
    wait_text(driver, "main section.panel .status", "Purged 1 message(s)")
    assert queue(broker, "ui-orders")["messages_ready"] == 0
    wait_text(driver, "#depth-ready", "0")

    # Delete it (confirmed): the page goes back to the list.
    css(driver, "#delete-queue").click()
    wait_for(driver, lambda d: css(d, "#confirm").is_displayed(), "the confirmation dialog")
    css(driver, "#confirm-yes").click()
    wait_for(driver, lambda d: d.execute_script("return location.hash") == "#/queues", "the queue list")
    assert broker.request("GET", "/queues/ui-orders")[0] == 404
    assert console_errors(driver) == []


def test_a_dead_letter_is_browsed_with_its_history_and_redriven(
    driver: Any, broker: BrokerProcess, screenshots: Screenshots
) -> None:
    broker.request("PUT", "/queues/ui-dlq", {})
    dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "ui-dlq"}
    assert broker.request("PUT", "/queues/ui-work", {"arguments": dlx})[0] == 201
    assert broker.request("POST", "/exchanges/amq.default/publish?routing_key=ui-work", b"poison")[0] == 200
    status, got = broker.request("POST", "/queues/ui-work/get?lease=60")
    lease = got["messages"][0]["lease_id"]
    assert broker.request("POST", "/queues/ui-work/nack", {"lease_ids": [lease], "requeue": False})[0] == 200

    open_page(driver, broker, "#/queue/ui-dlq")
    css(driver, "#browse-form button[type=submit]").click()
    wait_text(driver, "#browsed", "poison")
    assert "rejected in ui-work" in text_of(driver, "#browsed .deaths")
    screenshots.take(driver, "dead-letters")
    css(driver, "#redrive-form button[type=submit]").click()
    wait_text(driver, "#redrive-form .status", "Moved 1 message(s)")
    assert queue(broker, "ui-dlq")["messages_ready"] == 0
    assert queue(broker, "ui-work")["messages_ready"] == 1
    wait_text(driver, "#depth-ready", "0")


def test_queue_list_pages_filters_and_sorts_on_the_server(
    driver: Any, broker: BrokerProcess, screenshots: Screenshots
) -> None:
    for n in range(25):
        status, body = broker.request("PUT", f"/queues/page-{n:02d}", {"durable": False})
        assert status in (200, 201), body
    for n in range(3):  # page-24 gets the most messages
        assert broker.request("POST", "/exchanges/amq.default/publish?routing_key=page-24", b"x")[0] == 200
    open_page(driver, broker, "#/queues")
    fill(driver, "input[name=filter]", "PAGE-")
    wait_text(driver, "#queue-list caption", "25 of")
    from selenium.webdriver.support.ui import Select

    Select(css(driver, "select[name=page_size]")).select_by_value("20")
    wait_text(driver, "#page-of", "Page 1 of 2")
    assert len(driver.find_elements("css selector", "#queue-list tbody tr")) == 20
    css(driver, ".pager button:last-child").click()
    wait_text(driver, "#page-of", "Page 2 of 2")
    wait_for(driver, lambda d: len(d.find_elements("css selector", "#queue-list tbody tr")) == 5, "5 rows")
    # Sorting by depth is the server's: the deepest queue comes first.
    sort = [b for b in driver.find_elements("css selector", "#queue-list th button") if b.text.startswith("Ready")]
    sort[0].click()
    wait_text(driver, "#page-of", "Page 1 of 2")
    wait_for(driver, lambda d: text_of(d, "#queue-list tbody tr:first-child td").startswith("page-24"), "page-24 first")
    assert driver.execute_script("return document.activeElement.textContent").startswith("Ready")
    screenshots.take(driver, "queues")


def test_overview_exchanges_and_connections(driver: Any, broker: BrokerProcess, screenshots: Screenshots) -> None:
    # Overview: the counts and the charts are drawn from GET /overview, sampled every
    # two seconds; messages published between samples show as a publish rate.
    open_page(driver, broker, "#/")
    wait_for(driver, lambda d: text_of(d, "[data-key=version]") != "", "the summary")
    broker.request("PUT", "/queues/ui-traffic", {})
    for _ in range(3):
        for n in range(20):
            broker.request("POST", "/exchanges/amq.default/publish?routing_key=ui-traffic", b"%d" % n)
        shown = text_of(driver, "[data-key=messages_ready]")
        wait_for(driver, lambda d: text_of(d, "[data-key=messages_ready]") != shown, "the next sample")
    wait_for(driver, lambda d: d.find_elements("css selector", ".chart path.line.s0"), "a chart line")
    wait_for(driver, lambda d: text_of(d, "[data-series=published]") not in ("", "–", "0"), "a publish rate")
    assert text_of(driver, "[data-key=storage_ok]") == "ok"
    screenshots.take(driver, "overview")

    # Exchanges: declare, bind a queue, publish with a routing key: routed and confirmed.
    broker.request("PUT", "/queues/ui-bound", {})
    open_page(driver, broker, "#/exchanges")
    fill(driver, "#declare-exchange input[name=name]", "ui-events")
    css(driver, "#declare-exchange select[name=type] option[value=topic]").click()
    css(driver, "#declare-exchange button[type=submit]").click()
    wait_text(driver, "#declare-exchange .status", "declared")
    fill(driver, "#bind-form input[name=exchange]", "ui-events")
    fill(driver, "#bind-form input[name=destination]", "ui-bound")
    fill(driver, "#bind-form input[name=routing_key]", "order.*")
    css(driver, "#bind-form button[type=submit]").click()
    wait_text(driver, "#bind-form .status", "Bound")
    status, bindings = broker.request("GET", "/bindings")
    assert {"exchange": "ui-events", "queue": "ui-bound", "routing_key": "order.*", "arguments": {}} in bindings["bindings"]
    fill(driver, "#publish-exchange input[name=exchange]", "ui-events")
    fill(driver, "#publish-exchange input[name=routing_key]", "order.created")
    fill(driver, "#publish-exchange textarea[name=body]", "{\"id\": 1}")
    fill(driver, "#publish-exchange textarea[name=headers]", "{\"tenant\": \"acme\"}")
    css(driver, "#publish-exchange button[type=submit]").click()
    wait_text(driver, "#publish-exchange .status", "Confirm: ack; routed to 1 queue(s)")
    status, got = broker.request("GET", "/queues/ui-bound/messages")
    assert got["messages"][0]["properties"]["headers"] == {"tenant": "acme"}
    assert unlabelled_controls(driver) == []
    screenshots.take(driver, "exchanges")
    # Unbind it from the list of bindings.
    css(driver, "button[aria-label='Unbind ui-bound from ui-events (order.*)']").click()
    wait_for(driver, lambda d: "order.*" not in text_of(d, "#binding-list"), "the binding to go")
    status, bindings = broker.request("GET", "/bindings")
    assert not [b for b in bindings["bindings"] if b["exchange"] == "ui-events"]

    # Connections: a streaming consumer is listed; closing it from the page ends it.
    with socket.create_connection(("127.0.0.1", broker.port)) as sock:
        sock.sendall(b"GET /queues/ui-bound/stream?prefetch=5 HTTP/1.1\r\nHost: t\r\n\r\n")
        sock.settimeout(WAIT_S)
        sock.recv(4096)  # the response head (and the message)
        open_page(driver, broker, "#/connections")
        wait_text(driver, "#channel-list", "ui-bound")
        screenshots.take(driver, "connections")
        css(driver, "#channel-list button.danger").click()
        wait_for(driver, lambda d: css(d, "#confirm").is_displayed(), "the confirmation dialog")
        css(driver, "#confirm-yes").click()
        wait_text(driver, "#close-status", "closed")
        status, chans = broker.request("GET", "/channels")
        assert chans["channels"] == []
        wait_text(driver, "#channel-list", "No channels are open")
    assert console_errors(driver) == []


def test_narrow_screen_and_keyboard(driver: Any, broker: BrokerProcess) -> None:
    driver.set_window_size(390, 844)  # a phone
    try:
        for page in ("#/", "#/queues", "#/queue/ui-bound", "#/exchanges", "#/connections"):
            open_page(driver, broker, page)
            overflow = driver.execute_script(
                "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 0, f"{page} scrolls sideways by {overflow}px"
        # Keyboard, from a fresh load: the first Tab reaches the skip link, then the nav's links.
        open_page(driver, broker, "#/queues")
        driver.refresh()
        wait_for(driver, lambda d: d.execute_script("return !!document.querySelector('main h1')"), "the page")
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        def tab() -> Any:
            ActionChains(driver).send_keys(Keys.TAB).perform()
            return driver.switch_to.active_element

        assert tab().get_attribute("class") == "skip"
        assert tab().get_attribute("class") == "brand"
        nav = [tab() for _ in range(4)]
        assert [a.get_attribute("href").split("#")[1] for a in nav] == ["/", "/queues", "/exchanges", "/connections"]
        # The focus is visible: an outline is drawn around the focused link.
        style = driver.execute_script("return getComputedStyle(document.activeElement).outlineStyle")
        assert style != "none"
        # Enter follows the focused link, and the new page's content takes the focus.
        ActionChains(driver).send_keys(Keys.ENTER).perform()
        wait_for(driver, lambda d: d.execute_script("return location.hash") == "#/connections", "the connections page")
        wait_for(driver, lambda d: d.switch_to.active_element.get_attribute("id") == "main", "the focus on the page")
        assert "Connections" in text_of(driver, "main h1")
    finally:
        driver.set_window_size(1280, 1000)
