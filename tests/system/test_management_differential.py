"""The management API against RabbitMQ 3.10's management plugin: one script of
declares, bindings, publishes, gets, reads, deletes and health checks, run against a
private RabbitMQ (``rabbitmq_management`` enabled) and an ackbus subprocess. For
each step: the same status, the same error shape, ackbus's keys among RabbitMQ's
(ackbus leaves out what it cannot know: docs/management-api.md), and the same values
where they are deterministic (names, settings, counts, arguments, routed, payloads,
properties keys).

RabbitMQ's counts come from its statistics database, refreshed every
``collect_statistics_interval`` (here 500 ms): a step that reads them waits until
RabbitMQ's answer settles on ackbus's, within a deadline, before it compares.
Skipped where rabbitmq-server is not installed. Names begin with ``mg.``."""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.broker import BrokerProcess, amqp_broker, request

pika = pytest.importorskip("pika")
from bench.servers import RabbitServer, free_port, rabbitmq_installed  # noqa: E402

GUEST = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
#: How long RabbitMQ's statistics may take to show a change.
STATS_DEADLINE_S = 15.0


class ManagementRabbit(RabbitServer):
    """A private RabbitMQ node with the management plugin on its own loopback port."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, nodename="mgmtdiff@localhost")
        self.http_port = free_port()

    def _env(self) -> dict[str, str]:
        env = super()._env()
        base = self.workdir
        (base / "mgmt_plugins").write_text("[rabbitmq_management].\n")
        (base / "mgmt.conf").write_text(
            f"management.tcp.port = {self.http_port}\nmanagement.tcp.ip = 127.0.0.1\n"
            "collect_statistics_interval = 500\n"
        )
        env["RABBITMQ_ENABLED_PLUGINS_FILE"] = str(base / "mgmt_plugins")
        env["RABBITMQ_CONFIG_FILE"] = str(base / "mgmt")
        return env

    def new_ports(self) -> None:
        super().new_ports()
        self.http_port = free_port()


def wait_http(port: int, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if request(port, "GET", "/api/overview", headers=GUEST, timeout_s=5)[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the management API on port {port} did not answer")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ManagementRabbit, BrokerProcess]]:
    """The RabbitMQ node and the ackbus broker (with its AMQP listener), for the module."""
    if not rabbitmq_installed():
        pytest.skip("rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server)")
    rabbit = ManagementRabbit(tmp_path_factory.mktemp("mgmt-rabbit"))
    ackbus: BrokerProcess = amqp_broker(tmp_path_factory.mktemp("mgmt-ackbus") / "data")
    try:
        rabbit.start(120)
        wait_http(rabbit.http_port, 60)
        ackbus.start()
        # RabbitMQ's guest, so that both refuse the same missing or wrong credentials
        status, body = request(ackbus.port, "PUT", "/users/guest", {
            "password": "guest", "tags": ["administrator"],
            "permissions": {"configure": ".*", "write": ".*", "read": ".*"},
        })
        assert status == 201, body
        yield rabbit, ackbus
    finally:
        ackbus.stop()
        rabbit.stop()


@pytest.fixture(scope="module")
def servers(pair: tuple[ManagementRabbit, BrokerProcess]) -> tuple[int, int]:
    """(RabbitMQ's management port, ackbus's HTTP port)."""
    return pair[0].http_port, pair[1].port


class Script:
    """Runs each step on both servers and keeps the differences."""

    def __init__(self, rabbit_port: int, ackbus_port: int) -> None:
        self.ports = {"rabbitmq": rabbit_port, "ackbus": ackbus_port}
        self.differences: list[str] = []

    def call(
        self, side: str, method: str, path: str, body: Any = None, auth: dict[str, str] = GUEST
    ) -> tuple[int, Any, dict[str, str]]:
        """(status, JSON or raw body, headers) of one request (``auth``: its
        credentials' header, guest's by default)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[side], timeout=30)
        try:
            if body is not None and not isinstance(body, bytes):
                body = json.dumps(body).encode()
            conn.request(method, path, body=body, headers={**auth, "content-type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        try:
            parsed: Any = json.loads(data)
        except ValueError:
            parsed = data
        headers: dict[str, str] = {}
        for name, value in resp.getheaders():  # (a repeated field joined, as RFC 9110 reads it)
            headers[name.lower()] = f"{headers[name.lower()]}, {value}" if name.lower() in headers else value
        return resp.status, parsed, headers

    def step(
        self, method: str, path: str, body: Any = None, *, same: Any = "all", keys: bool = False,
        settle: bool = False, header: str | None = None, auth: dict[str, str] = GUEST,
    ) -> tuple[Any, Any]:
        """Run one request on both; compare statuses, and bodies through ``same``: "all"
        (equal), None (not compared), or a function of a body giving what must be
        equal. ``keys``: ackbus's keys (of an object, or of a list's first item) must
        be among RabbitMQ's. ``settle``: retry RabbitMQ's read until it agrees.
        ``header``: a response header that must be equal too. ``auth``: the
        credentials' header (guest's by default)."""
        ours = self.call("ackbus", method, path, body, auth)
        theirs = self.call("rabbitmq", method, path, body, auth)
        deadline = time.monotonic() + STATS_DEADLINE_S
        while settle and self._compared(theirs, same) != self._compared(ours, same) and time.monotonic() < deadline:
            time.sleep(0.2)
            theirs = self.call("rabbitmq", method, path, body, auth)
        where = f"{method} {path} {body!r}"
        if theirs[0] != ours[0]:
            self.differences.append(f"{where}: status rabbitmq {theirs[0]} ackbus {ours[0]} ({ours[1]!r})")
            return theirs[1], ours[1]
        if self._compared(theirs, same) != self._compared(ours, same):
            self.differences.append(
                f"{where}:\n  rabbitmq {self._compared(theirs, same)!r}\n  ackbus   {self._compared(ours, same)!r}"
            )
        if header is not None and theirs[2].get(header) != ours[2].get(header):
            self.differences.append(f"{where}: {header} rabbitmq {theirs[2].get(header)!r} ackbus {ours[2].get(header)!r}")
        if keys:
            a, b = theirs[1], ours[1]
            if isinstance(a, list):
                a, b = (a[0] if a else {}), (b[0] if b else {})
            extra = set(b) - set(a)
            if extra:
                self.differences.append(f"{where}: ackbus has keys RabbitMQ has not: {sorted(extra)}")
        return theirs[1], ours[1]

    @staticmethod
    def _compared(answer: tuple[int, Any, dict[str, str]], same: Any) -> Any:
        if same is None:
            return None
        if same == "all":
            return answer[1]
        return same(answer[1])


def pick(*names: str) -> Any:
    """Compare only these keys of an object."""
    return lambda body: {k: body.get(k) for k in names} if isinstance(body, dict) else body


def error_kind(body: Any) -> Any:
    """An error's ``error`` field, and that it has a textual ``reason``."""
    return (body.get("error"), isinstance(body.get("reason"), (str, list))) if isinstance(body, dict) else body


def sorted_bindings(body: Any) -> Any:
    return sorted(body, key=lambda b: (b["source"], b["destination"], b["routing_key"], b["properties_key"]))


QUEUE_FIELDS = ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "type", "state", "policy",
                "messages", "messages_ready", "messages_unacknowledged", "consumers")
EXCHANGE_FIELDS = ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments")
PUBLISH = "/api/exchanges/%2F/{}/publish"


def publish(routing_key: str, payload: str, encoding: str = "string", properties: Any = None) -> dict[str, Any]:
    return {"properties": properties if properties is not None else {}, "routing_key": routing_key,
            "payload": payload, "payload_encoding": encoding}


def test_one_script_against_rabbitmq(servers: tuple[int, int]) -> None:
    s = Script(*servers)
    # declares: created, found, inequivalent, bad
    s.step("PUT", "/api/queues/%2F/mg.q1", {"durable": True, "arguments": {"x-max-length": 10}})
    s.step("PUT", "/api/queues/%2F/mg.q1", {"durable": True, "arguments": {"x-max-length": 10}})
    s.step("PUT", "/api/queues/%2F/mg.q1", {"durable": False}, same=error_kind)
    s.step("PUT", "/api/queues/%2F/mg.q2", {"vhost": "/", "name": "mg.q2"})
    s.step("GET", "/api/queues/%2F/mg.q2", same=pick(*QUEUE_FIELDS), keys=True, settle=True)
    s.step("PUT", "/api/queues/%2F/mg.q3", b"not json", same=error_kind)
    s.step("PUT", "/api/queues/%2F/mg.q3", {"durable": "yes"}, same=pick("error"))
    s.step("PUT", "/api/queues/%2F/mg.q3", {"arguments": {"x-max-length": "ten"}}, same=error_kind)
    s.step("PUT", "/api/exchanges/%2F/mg.x", {"type": "topic", "durable": True})
    s.step("PUT", "/api/exchanges/%2F/mg.x", {"type": "topic", "durable": True})
    s.step("PUT", "/api/exchanges/%2F/mg.x", {"type": "fanout", "durable": True}, same=error_kind)
    s.step("PUT", "/api/exchanges/%2F/mg.y", {})
    s.step("PUT", "/api/exchanges/%2F/mg.z", {"type": "bogus"}, same=error_kind)
    s.step("GET", "/api/exchanges/%2F/mg.y", same=pick(*EXCHANGE_FIELDS), keys=True)
    s.step("GET", "/api/exchanges/%2F/amq.default", same=pick(*EXCHANGE_FIELDS), keys=True)
    # columns on one object, as on a list
    s.step("GET", "/api/queues/%2F/mg.q2?columns=name,durable,arguments")
    s.step("GET", "/api/exchanges/%2F/mg.y?columns=name,type")
    # bindings: made, listed, their Location and properties keys
    for path, body in [
        ("/api/bindings/%2F/e/mg.x/q/mg.q1", {"routing_key": "a.#", "arguments": {}}),
        ("/api/bindings/%2F/e/mg.x/e/mg.y", {"routing_key": "k~1 #"}),
        ("/api/bindings/%2F/e/mg.x/e/mg.y", {"routing_key": ""}),
    ]:
        s.step("POST", path, body, header="location")
    s.step("POST", "/api/bindings/%2F/e/mg.x/q/mg.nope", {"routing_key": "k"}, same=error_kind)
    s.step("GET", "/api/queues/%2F/mg.q1/bindings", same=sorted_bindings, keys=True)
    s.step("GET", "/api/bindings/%2F/e/mg.x/e/mg.y", same=sorted_bindings)
    # publish and get
    s.step("POST", PUBLISH.format("mg.x"), publish("a.b", "hello"))
    props = {"delivery_mode": 2, "headers": {"h": 1}, "expiration": "60000", "priority": 3, "content_type": "text/plain"}
    s.step("POST", PUBLISH.format("amq.default"), publish("mg.q1", "/w==", "base64", props))
    s.step("POST", PUBLISH.format("mg.x"), publish("zz", "lost"))
    s.step("POST", PUBLISH.format("mg.nope"), publish("k", "x"), same=error_kind)
    s.step("POST", PUBLISH.format("amq.default"), {"routing_key": "k", "payload": "x", "properties": {}}, same=error_kind)
    # a message's user_id is the caller's (guest here) or refused
    s.step("POST", PUBLISH.format("mg.x"), publish("zz", "mine", properties={"user_id": "guest"}))
    s.step("POST", PUBLISH.format("mg.x"), publish("zz", "forged", properties={"user_id": "mallory"}), same=error_kind)
    # direct reply-to itself names no consumer here: refused; a decoded name is stored
    s.step("POST", PUBLISH.format("mg.x"), publish("zz", "rpc", properties={"reply_to": "amq.rabbitmq.reply-to"}))
    s.step("POST", PUBLISH.format("mg.x"), publish("zz", "rpc", properties={"reply_to": "amq.rabbitmq.reply-to.x"}))
    s.step("GET", "/api/queues/%2F/mg.q1", same=pick(*QUEUE_FIELDS), keys=True, settle=True)
    s.step("POST", "/api/queues/%2F/mg.q1/get", {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"})
    s.step("POST", "/api/queues/%2F/mg.q1/get", {"count": "1", "ackmode": "ack_requeue_false", "encoding": "base64",
                                                 "truncate": 2})
    s.step("POST", "/api/queues/%2F/mg.q1/get", {"count": 1, "encoding": "auto"}, same=error_kind)
    s.step("POST", "/api/queues/%2F/mg.q1/get", {"count": 1, "ackmode": "ack_requeue_true", "encoding": "xx"},
           same=error_kind)
    s.step("GET", "/api/queues/%2F/mg.q1", same=pick(*QUEUE_FIELDS), settle=True)
    # lists: ours among theirs
    s.step("GET", "/api/queues/%2F?columns=name,messages&name=mg.&page=1",
           same=lambda b: sorted(i["name"] for i in b["items"]) if isinstance(b, dict) else b, settle=True)
    s.step("GET", "/api/exchanges/%2F", same=lambda b: sorted(x["name"] for x in b if x["name"].startswith("mg.")),
           keys=True)
    # a page past the last: RabbitMQ's 400 (the page right after a full one is empty);
    # the first page of nothing has no pages
    s.step("GET", "/api/queues/%2F?name=mg.&page=3&page_size=1", same=pick("items", "page_count", "filtered_count"))
    s.step("GET", "/api/queues/%2F?name=mg.&page=4&page_size=1")
    s.step("GET", "/api/queues/%2F?name=mg.none&page=1", same=pick("items", "page_count", "filtered_count"))
    s.step("GET", "/api/queues/%2F?name=mg.none&page=2")
    # unbind by the properties key the listing gives, deletes, purge
    listed = request(servers[1], "GET", "/api/bindings/%2F/e/mg.x/e/mg.y", headers=GUEST)[1]
    for binding in listed:
        s.step("DELETE", f"/api/bindings/%2F/e/mg.x/e/mg.y/{quote(binding['properties_key'], safe='')}")
    s.step("DELETE", "/api/bindings/%2F/e/mg.x/e/mg.y/nope")
    s.step("DELETE", "/api/queues/%2F/mg.q1?if-empty=true", same=error_kind)
    s.step("DELETE", "/api/queues/%2F/mg.q1/contents")
    s.step("DELETE", "/api/queues/%2F/mg.q1?if-empty=true")
    s.step("DELETE", "/api/queues/%2F/mg.q1")
    s.step("DELETE", "/api/queues/%2F/mg.q1/contents")
    s.step("DELETE", "/api/exchanges/%2F/mg.y")
    s.step("DELETE", "/api/exchanges/%2F/mg.y")
    s.step("GET", "/api/queues/mg.vhost")
    s.step("GET", "/api/queues/%2F/mg.nope")
    # the HTTP layer's refusals: 405 without a body, an unknown path's 404, 401
    s.step("PATCH", "/api/queues/%2F/mg.q2")
    s.step("POST", "/api/overview", {})
    s.step("GET", "/api/mg.nosuch")
    wrong = {"Authorization": "Basic " + base64.b64encode(b"guest:wrong").decode()}
    for auth in (wrong, {"Authorization": "Basic " + base64.b64encode(b"mg.nobody:x").decode()}):
        s.step("GET", "/api/overview", same=error_kind, auth=auth)
        s.step("GET", "/api/queues/%2F/mg.q2", same=error_kind, auth=auth)
    # no credentials: RabbitMQ's body is empty, ackbus says why (both challenge)
    for side in ("rabbitmq", "ackbus"):
        status, _body, headers = s.call(side, "GET", "/api/overview", auth={})
        if (status, "basic" in headers.get("www-authenticate", "").lower()) != (401, True):
            s.differences.append(f"GET /api/overview without credentials: {side} {status} {headers}")
    # health
    s.step("GET", "/api/aliveness-test/%2F")
    for check in ("alarms", "local-alarms", "virtual-hosts"):
        s.step("GET", f"/api/health/checks/{check}")
    # the monitoring reads: ackbus's keys among RabbitMQ's
    s.step("GET", "/api/overview", same=lambda b: (sorted(b["object_totals"]), sorted(b["queue_totals"])), keys=True)
    s.step("GET", "/api/nodes", same=lambda b: len(b), keys=True)
    s.step("GET", "/api/vhosts", same=lambda b: [v["name"] for v in b], keys=True)
    s.step("GET", "/api/vhosts/%2F", same=pick("name", "description", "tags", "tracing"), keys=True)
    s.step("GET", "/api/whoami", same=lambda b: sorted(b))
    s.step("GET", "/api/whoami?columns=name")
    s.step("GET", "/api/vhosts/%2F?columns=name")
    s.step("GET", "/api/overview?columns=node,rates_mode", same=lambda b: sorted(b))
    assert not s.differences, "\n".join(s.differences)


def test_who_is_connected_against_rabbitmq(pair: tuple[ManagementRabbit, BrokerProcess], servers: tuple[int, int]) -> None:
    """A pika consumer on each: the connection, its channel and its consumer listed
    with RabbitMQ's keys (ackbus's among them) and the same consumer's values."""
    s = Script(*servers)
    s.step("PUT", "/api/queues/%2F/mg.work", {"durable": False})
    connections = []
    try:
        for port in (pair[0].port, pair[1].amqp_port):
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
            connections.append(conn)
            ch = conn.channel()
            ch.basic_qos(prefetch_count=3)
            ch.basic_consume("mg.work", lambda *_: None, consumer_tag="mg.c1")
            conn.channel()  # a second channel of the same connection

        def consumer(body: Any) -> Any:
            return [
                (c["consumer_tag"], c["queue"], c["ack_required"], c["exclusive"], c["prefetch_count"])
                for c in body if c["consumer_tag"] == "mg.c1"
            ]

        s.step("GET", "/api/consumers", same=consumer, keys=True, settle=True)
        s.step("GET", "/api/consumers/%2F", same=consumer, settle=True)
        s.step("GET", "/api/connections", same=lambda b: [(c["vhost"], c["channels"]) for c in b], keys=True,
               settle=True)
        s.step("GET", "/api/channels",
               same=lambda b: sorted((c["vhost"], c["consumer_count"], c["prefetch_count"]) for c in b), keys=True,
               settle=True)
        s.step("GET", "/api/queues/%2F/mg.work", same=pick("consumers"), settle=True)
        # one connection and one channel by name (each server's own names): found,
        # whole (RabbitMQ applies no columns to these), ackbus's keys among RabbitMQ's
        for kind in ("connections", "channels"):
            answers = []
            for side in ("rabbitmq", "ackbus"):
                first = s.call(side, "GET", f"/api/{kind}")[1][0]
                status, one, _headers = s.call(side, "GET", f"/api/{kind}/{quote(first['name'], safe='')}?columns=name")
                answers.append((status, one["name"] == first["name"], sorted(one)))
                answers.append(s.call(side, "GET", f"/api/{kind}/mg.nope")[:2])
            theirs, ours = answers[:2], answers[2:]
            extra = set(ours[0][2]) - set(theirs[0][2])
            if (theirs[0][:2], theirs[1]) != (ours[0][:2], ours[1]) or len(ours[0][2]) < 2 or extra:
                s.differences.append(f"GET /api/{kind}/{{name}}: rabbitmq {theirs} ackbus {ours} (extra keys {extra})")
        # (RabbitMQ has one exchange more: amq.rabbitmq.trace)
        s.step("GET", "/api/overview", same=lambda b: {k: v for k, v in b["object_totals"].items() if k != "exchanges"},
               settle=True)
    finally:
        for conn in connections:
            conn.close()
    assert not s.differences, "\n".join(s.differences)


def test_rabbitmqadmin_against_both(pair: tuple[ManagementRabbit, BrokerProcess], tmp_path: Path) -> None:
    """RabbitMQ's own CLI, ``rabbitmqadmin`` (not on PyPI: the management plugin serves
    it at ``/cli/rabbitmqadmin``, taken here from the private node), runs one session
    of declares, a publish, lists, a get and deletes against each: the same exit
    codes and the same output where it is deterministic."""
    rabbit, ackbus = pair
    status, script = request(rabbit.http_port, "GET", "/cli/rabbitmqadmin", headers=GUEST)
    assert status == 200 and isinstance(script, bytes) and script.startswith(b"#!")
    path = tmp_path / "rabbitmqadmin"
    path.write_bytes(script)
    session: list[tuple[list[str], bool]] = [  # (arguments, whether the output must be the same)
        (["declare", "queue", "name=mg.rq", "durable=true"], True),
        (["declare", "exchange", "name=mg.rx", "type=fanout"], True),
        (["declare", "binding", "source=mg.rx", "destination=mg.rq", "routing_key=k"], True),
        (["publish", "exchange=mg.rx", "routing_key=k", "payload=hello"], True),
        (["publish", "exchange=mg.none", "routing_key=k", "payload=hello"], False),
        (["get", "queue=mg.rq", "ackmode=ack_requeue_true"], True),
        (["list", "bindings", "source", "destination", "routing_key"], False),
        (["list", "nodes"], False),
        (["list", "vhosts", "name"], True),
        (["show", "overview"], False),
        (["purge", "queue", "name=mg.rq"], True),
        (["delete", "binding", "source=mg.rx", "destination_type=queue", "destination=mg.rq", "properties_key=k"], True),
        (["delete", "queue", "name=mg.rq"], True),
        (["delete", "exchange", "name=mg.rx"], True),
        (["delete", "queue", "name=mg.rq"], False),
    ]
    differences = []
    for args, same_output in session:
        answers = []
        for port in (rabbit.http_port, ackbus.port):
            done = subprocess.run(
                [sys.executable, str(path), "-H", "127.0.0.1", "-P", str(port), "-u", "guest", "-p", "guest", *args],
                capture_output=True, text=True, timeout=60,
            )
            answers.append((done.returncode, done.stdout if same_output else None))
        if answers[0] != answers[1]:
            differences.append(f"{' '.join(args)}:\n  rabbitmq {answers[0]!r}\n  ackbus   {answers[1]!r}")
    assert not differences, "\n".join(differences)
