"""An etcd and cluster nodes in subprocesses, all on loopback (tests/support/etcd.py,
tests/support/broker.py). The nodes are stopped by PID at the end of each test; the
etcd is one per xdist worker, emptied before each test (the ``etcd`` fixture), and
stopped by PID at the end of the run."""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerProcess, free_port, stop_all
from tests.support.etcd import EtcdProcess, require_etcd
from tests.support.rawchannel import RawChannel

#: A short lease, so that a lapse is seen within a test's patience.
TTL_S = 2


def node_process(
    tmp: Path, etcd: EtcdProcess, name: str, *, ttl_s: int | None = TTL_S, extra: tuple[str, ...] = ()
) -> BrokerProcess:
    """A node's process (not started); ``ttl_s`` None: the default lease TTL."""
    port = free_port()
    ttl = ("--cluster-lease-ttl-s", str(ttl_s)) if ttl_s is not None else ()
    return BrokerProcess(
        tmp / name,
        port=port,
        args=(
            "--etcd", etcd.url,
            "--node-name", name,
            "--advertise-url", f"http://127.0.0.1:{port}",
            *ttl,
            *extra,
        ),
    )


def wait_for(
    what: str, check: Callable[[], Any], timeout_s: float = 15.0, *, retry_on: tuple[type[BaseException], ...] = ()
) -> Any:
    """Poll ``check`` until it returns something true; fail naming ``what``. An
    exception of ``retry_on`` (say OSError, a node not listening yet) counts as false."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except retry_on as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


def https_call(
    port: int, ca: Path, method: str, path: str, body: Any = None, *, client_cert: tuple[Path, Path] | None = None
) -> tuple[int, Any]:
    """A request to a node serving https on ``port`` (certificate signed by ``ca``,
    for ``localhost``), presenting ``client_cert`` (cert, key) when given: (status,
    JSON answer or None)."""
    context = ssl.create_default_context(cafile=str(ca))
    if client_cert is not None:
        context.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
    conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=15)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, body=data)
        answer = conn.getresponse()
        raw = answer.read()
        return answer.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def wait_synced(node: BrokerProcess, timeout_s: float = 15.0) -> None:
    """Until ``node`` serves as a member: its view read from etcd and its own
    registration made (before that, a metadata change it is asked for answers 503)."""

    def synced() -> bool:
        status, body = node.request("GET", "/cluster")
        return status == 200 and bool(body.get("synced")) and bool(body.get("member"))

    wait_for(f"node on port {node.port} synced with etcd", synced, timeout_s)


#: What a watched pika consumer recorded of one delivery: (body, redelivered, delivery
#: tag, consumer tag).
Got = tuple[bytes, bool, int, str]


def watched_consumer(conn: Any, queue: str, consumer_tag: str) -> tuple[Any, list[Got], list[Any], str]:
    """A pika consumer of ``queue`` (prefetch 10, manual acks) on a new channel of
    ``conn``: (the channel, its deliveries as they come, the ``basic.cancel`` frames the
    server sent it, its tag)."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    cancelled: list[Any] = []
    got: list[Got] = []
    ch.add_on_cancel_callback(cancelled.append)
    tag = ch.basic_consume(
        queue, lambda _c, m, _p, b: got.append((b, m.redelivered, m.delivery_tag, m.consumer_tag)), consumer_tag=consumer_tag
    )
    return ch, got, cancelled, tag


def channel_publish(node: BrokerProcess, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Publish ``ops`` on one channel of ``node``; the confirms (and returns), in order."""
    ch = RawChannel(node.port)
    try:
        ch.send(*[{"op": "publish", **op} for op in ops])
        events: list[dict[str, Any]] = []
        settled = 0
        while settled < len(ops):
            ev = ch.next_event()
            events.append(ev)
            if ev["ev"] in ("ack", "nack"):
                settled = ev["delivery_tag"]
            assert ev["ev"] in ("ack", "nack", "return"), ev
        return events
    finally:
        ch.close()


def wait_caught_up(seer: BrokerProcess, *sources: BrokerProcess, timeout_s: float = 15.0) -> None:
    """Until ``seer``'s view holds every change each of ``sources`` had in its view
    (etcd's revision): a change one node made, which it sees at once, reaches the
    others by their watch, a moment later. (A binding to another node's queue is
    metadata only, in no node's ``/bindings``: this is how a test waits for one.)"""

    def revision(node: BrokerProcess) -> int:
        status, body = node.request("GET", "/cluster")
        assert status == 200, body
        return int(body["revision"])

    target = max(revision(source) for source in sources)
    wait_for(f"node on port {seer.port} at revision {target}", lambda: revision(seer) >= target, timeout_s)


def queues_owned_by(node: BrokerProcess, owner: str, headers: dict[str, str] | None = None) -> set[str]:
    """The queues ``node``'s view gives to node ``owner`` (``headers``: credentials)."""
    status, body = node.request("GET", "/cluster", headers=headers)
    assert status == 200, body
    return {q for n in body["nodes"] if n["name"] == owner for q in n["queues"]}


def cluster_nodes(node: BrokerProcess) -> dict[str, dict[str, Any]]:
    status, body = node.request("GET", "/cluster")
    assert status == 200, body
    return {n["name"]: n for n in body["nodes"]}


@pytest.fixture(scope="session")
def _worker_etcd() -> Iterator[list[EtcdProcess]]:
    """The etcd this worker's tests share (at most one at a time), stopped at the end."""
    held: list[EtcdProcess] = []
    try:
        yield held
    finally:
        for proc in held:
            proc.stop()


def _emptied(proc: EtcdProcess) -> bool:
    """Whether ``proc`` still runs and could be emptied for the next test."""
    if proc.proc is None or proc.proc.poll() is not None or not proc.healthy():
        return False
    try:
        proc.empty()
    except (AssertionError, OSError, ValueError):
        return False
    return True


@pytest.fixture
def etcd(_worker_etcd: list[EtcdProcess], tmp_path_factory: pytest.TempPathFactory) -> EtcdProcess:
    """An empty etcd of the test's own: one process per worker, emptied (every lease
    revoked, every key deleted) before each test, which then sees what a new etcd
    holds. Every node a test started is stopped before the next test begins (the
    ``nodes`` fixture, the tests' ``finally``). A test may stop etcd or restart it: an
    etcd that no longer runs, or refuses to be emptied, is replaced by a new one (an
    etcd start is ~0.5 s, ~100 tests ask for one)."""
    require_etcd()
    if _worker_etcd and not _emptied(_worker_etcd[0]):
        _worker_etcd.pop().stop()
    if not _worker_etcd:
        proc = EtcdProcess(tmp_path_factory.mktemp("etcd"))
        _worker_etcd.append(proc)
        proc.start()
    return _worker_etcd[0]


@pytest.fixture
def nodes(tmp_path: Path, etcd: EtcdProcess) -> Iterator[Callable[[str], BrokerProcess]]:
    """``nodes("a")``: a node named ``a``, started; every one is stopped at the end."""
    started: list[BrokerProcess] = []

    def start(name: str) -> BrokerProcess:
        proc = node_process(tmp_path, etcd, name)
        started.append(proc)
        proc.start()
        wait_synced(proc)
        return proc

    try:
        yield start
    finally:
        stop_all(started)
