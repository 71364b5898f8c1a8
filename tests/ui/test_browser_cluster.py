"""The management UI's Cluster page in a real browser: on a node of a two-node
cluster (a private etcd, tests/cluster/conftest.py) it shows what ``GET /cluster``
answers (the nodes, who owns which queue, a node going down, etcd's endpoints, the
view's revision, a replicated queue's leader and in-sync set); on a single node the
section is hidden and the page says "single node".

One etcd and two nodes for the module, short lease (a node's death is seen in
seconds); waits are for a condition on the page, never fixed sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import cluster_nodes, node_process, wait_synced
from tests.cluster.conftest import wait_for as wait_until
from tests.support.broker import BrokerProcess
from tests.support.etcd import EtcdProcess, require_etcd
from tests.ui.conftest import Screenshots
from tests.ui.helpers import console_errors, open_page, text_of, wait_for, wait_text

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory, driver: Any) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    """Nodes ``a`` and ``b`` of one cluster, both alive (``driver`` first: the browser
    tests skip before etcd is started when there is no browser)."""
    require_etcd()
    tmp: Path = tmp_path_factory.mktemp("ui-cluster")
    etcd = EtcdProcess(tmp / "etcd")
    started: list[BrokerProcess] = []
    try:
        etcd.start()
        for name in ("a", "b"):
            proc = node_process(tmp, etcd, name)
            started.append(proc)
            proc.start()
            wait_synced(proc)  # its view read from etcd: before, a declare on it answers 503
        a, b = started
        wait_until("both nodes alive", lambda: all(n["alive"] for n in cluster_nodes(a).values()) and len(cluster_nodes(a)) == 2)
        yield a, b
    finally:
        for proc in started:
            proc.stop()
        etcd.stop()


def nav_cluster_shown(driver: Any) -> bool:
    return bool(driver.execute_script("const li = document.getElementById('nav-cluster'); return !!li && !li.hidden"))


def test_single_node_hides_the_section_and_says_so(driver: Any, broker: BrokerProcess) -> None:
    open_page(driver, broker, "#/cluster")
    wait_text(driver, "#single-node", "Single node")
    # the nav learned from GET /cluster that this broker is not clustered
    wait_for(driver, lambda d: d.execute_script("return !!document.getElementById('nav-cluster')"), "the nav")
    assert not nav_cluster_shown(driver)


def test_cluster_page_shows_nodes_owners_etcd_and_replicated_queues(
    driver: Any, two_nodes: tuple[BrokerProcess, BrokerProcess], screenshots: Screenshots
) -> None:
    a, b = two_nodes
    status, body = b.request("PUT", "/queues/ui-owned-by-b", {"arguments": {"x-queue-leader-locator": "client-local"}})
    assert status == 201, body
    status, body = a.request("PUT", "/queues/ui-replicated", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
    assert status == 201, body
    wait_until("a sees b's queue", lambda: a.request("GET", "/queues/ui-owned-by-b")[0] == 200)

    open_page(driver, a, "#/cluster")
    wait_for(driver, nav_cluster_shown, "the Cluster section in the nav")
    wait_text(driver, "#cluster-summary", "a (http://127.0.0.1:")
    revision = a.request("GET", "/cluster")[1]["revision"]
    wait_for(driver, lambda d: int(text_of(d, "#cluster-revision").replace(",", "") or 0) >= revision, "the view's revision")
    nodes_text = text_of(driver, "#cluster-nodes")
    assert "a (this node)" in nodes_text and b.url in nodes_text, nodes_text
    wait_for(driver, lambda d: "ui-owned-by-b" in text_of(d, "#cluster-nodes tr:nth-child(2)"), "b owning its queue")
    etcd_text = text_of(driver, "#cluster-etcd")
    assert "etcd answers" in etcd_text and "healthy" in etcd_text, etcd_text
    # the quorum queue: its leader and in-sync set as GET /cluster has them
    replicated = wait_until(
        "a leader of ui-replicated",
        lambda: (lambda r: r if r.get("leader") else None)(a.request("GET", "/cluster")[1]["replicated_queues"].get("ui-replicated", {})),
        timeout_s=30,
    )
    wait_for(driver, lambda d: "ui-replicated" in text_of(d, "#cluster-replicated") and replicated["leader"] in text_of(d, "#cluster-replicated"),
             "the replicated queue with its leader")
    screenshots.take(driver, "cluster")

    # b is killed: the page (refreshing itself) shows it down, its queue still listed
    b.kill()
    wait_for(driver, lambda d: "down" in text_of(d, "#cluster-nodes tr:nth-child(2)"), "b shown down")
    assert "ui-owned-by-b" in text_of(driver, "#cluster-nodes tr:nth-child(2)")
    assert console_errors(driver) == []
