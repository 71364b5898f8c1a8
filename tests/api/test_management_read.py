"""The management API's reads (broker/api/management/reading.py, clients.py): RabbitMQ
3.10's shapes filled with ackbus's real values, the list query (columns, pages), the
one vhost, and what needs the administrator tag."""

from __future__ import annotations

from urllib.parse import quote

import trio

from tests.support.app import MemoryBroker
from tests.support.channel import Clients
from tests.support.http import HTTPClient
from tests.support.memory_fixtures import api, broker, clients  # noqa: F401 (fixtures)
from tests.support.security import add_user


async def declare_and_fill(api: HTTPClient) -> None:
    assert (await api.put("/api/queues/%2F/jobs", json={"durable": True, "arguments": {"x-max-length": 10}})).status == 201
    assert (await api.put("/api/exchanges/%2F/events", json={"type": "topic", "durable": True})).status == 201
    assert (await api.post("/api/bindings/%2F/e/events/q/jobs", json={"routing_key": "a.#"})).status == 201
    for body in ("one", "two"):
        reply = await api.post(
            "/api/exchanges/%2F/events/publish",
            json={"properties": {}, "routing_key": "a.b", "payload": body, "payload_encoding": "string"},
        )
        assert reply.json() == {"routed": True}


async def test_a_queue_has_rabbitmqs_fields_with_ackbus_values(api: HTTPClient) -> None:
    await declare_and_fill(api)
    got = await api.post("/api/queues/%2F/jobs/get", json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert got.status == 200
    q = (await api.get("/api/queues/%2F/jobs")).json()
    assert q["name"] == "jobs" and q["vhost"] == "/" and q["durable"] is True and q["auto_delete"] is False
    assert q["arguments"] == {"x-max-length": 10} and q["type"] == "classic" and q["state"] == "running"
    assert (q["messages"], q["messages_ready"], q["messages_unacknowledged"], q["consumers"]) == (1, 1, 0, 0)
    assert q["message_stats"]["publish"] == 2 and q["message_stats"]["deliver_get"] == 1
    assert q["message_stats"]["ack"] == 1 and q["message_stats"]["publish_details"] == {"rate": 0.0}
    assert q["node"].startswith("ackbus@") and q["policy"] is None
    # listed with the others, and under the vhost
    listed = (await api.get("/api/queues")).json()
    assert [item["name"] for item in listed] == ["jobs"]
    assert (await api.get("/api/queues/%2F")).json() == listed


async def test_rates_come_from_the_runtimes_history(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    await declare_and_fill(api)
    history = broker.runtime.history
    history.sample()
    await api.post(
        "/api/exchanges/%2F/events/publish",
        json={"properties": {}, "routing_key": "a.b", "payload": "x", "payload_encoding": "string"},
    )
    await trio.sleep(0.01)  # (real time between the two samples: the rate's divisor)
    history.sample()
    q = (await api.get("/api/queues/%2F/jobs")).json()
    assert q["message_stats"]["publish_details"]["rate"] > 0
    assert q["messages_ready_details"]["rate"] > 0
    overview = (await api.get("/api/overview")).json()
    assert overview["message_stats"]["publish_details"]["rate"] > 0


async def test_exchanges_and_bindings(api: HTTPClient) -> None:
    await declare_and_fill(api)
    x = (await api.get("/api/exchanges/%2F/events")).json()
    assert {k: x[k] for k in ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments")} == {
        "name": "events", "vhost": "/", "type": "topic", "durable": True, "auto_delete": False,
        "internal": False, "arguments": {},
    }
    assert x["message_stats"] == {"publish_in": 2, "publish_out": 2}
    default = (await api.get("/api/exchanges/%2F/amq.default")).json()
    assert default["name"] == "" and default["type"] == "direct"
    names = [item["name"] for item in (await api.get("/api/exchanges")).json()]
    assert "" in names and "amq.topic" in names and "events" in names
    expected = [
        {"source": "", "vhost": "/", "destination": "jobs", "destination_type": "queue", "routing_key": "jobs",
         "arguments": {}, "properties_key": "jobs"},
        {"source": "events", "vhost": "/", "destination": "jobs", "destination_type": "queue",
         "routing_key": "a.#", "arguments": {}, "properties_key": "a.%23"},
    ]
    assert (await api.get("/api/queues/%2F/jobs/bindings")).json() == expected
    assert (await api.get("/api/bindings")).json() == expected
    assert (await api.get("/api/bindings/%2F")).json() == expected
    assert (await api.get("/api/bindings/%2F/e/events/q/jobs")).json() == expected[1:]


async def test_overview_nodes_vhosts_whoami(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    await declare_and_fill(api)
    broker.app.listeners.add("amqp", "127.0.0.1", 5672)
    o = (await api.get("/api/overview")).json()
    assert o["object_totals"]["queues"] == 1 and o["object_totals"]["exchanges"] >= 7
    assert o["queue_totals"]["messages"] == 2 and o["queue_totals"]["messages_ready"] == 2
    assert o["message_stats"]["publish"] == 2 and o["message_stats"]["confirm"] == 2
    assert o["listeners"][-1] == {"node": o["node"], "protocol": "amqp", "ip_address": "127.0.0.1", "port": 5672}
    assert [item["protocol"] for item in o["listeners"]] == ["http", "amqp"]
    nodes = (await api.get("/api/nodes")).json()
    assert [n["name"] for n in nodes] == [o["node"]]
    node = (await api.get(f"/api/nodes/{o['node']}")).json()
    assert node["running"] is True and node["mem_used"] > 0 and node["mem_alarm"] is False
    assert node["uptime"] >= 0 and node["fd_used"] > 0
    assert (await api.get("/api/nodes/rabbit@elsewhere")).status == 404
    vhosts = (await api.get("/api/vhosts")).json()
    assert [v["name"] for v in vhosts] == ["/"] and vhosts[0]["messages"] == 2
    assert (await api.get("/api/vhosts/%2F")).json()["name"] == "/"
    # no users: nobody authenticated, and anybody may do everything (loopback only)
    assert (await api.get("/api/whoami")).json() == {"name": "", "tags": ["administrator"]}


async def test_another_vhost_is_not_found_as_rabbitmq_says(api: HTTPClient) -> None:
    for path in ("/api/queues/other", "/api/queues/other/jobs", "/api/exchanges/vh", "/api/vhosts/vh",
                 "/api/bindings/vh", "/api/consumers/vh", "/api/aliveness-test/vh"):
        reply = await api.get(path)
        assert (reply.status, reply.json()) == (404, {"error": "Object Not Found", "reason": "Not Found"}), path
    assert (await api.put("/api/queues/other/q", json={})).status == 404
    assert (await api.get("/api/queues")).json() == []  # nothing was declared


async def test_missing_objects_are_not_found(api: HTTPClient) -> None:
    for path in ("/api/queues/%2F/nope", "/api/exchanges/%2F/nope", "/api/queues/%2F/nope/bindings",
                 "/api/bindings/%2F/e/amq.direct/q/nope"):
        reply = await api.get(path)
        assert (reply.status, reply.json()) == (404, {"error": "Object Not Found", "reason": "Not Found"}), path


async def test_columns_and_pages(api: HTTPClient) -> None:
    for name in ("b", "a", "c"):
        await api.put(f"/api/queues/%2F/{name}", json={})
    await api.post("/api/exchanges/%2F/amq.default/publish",
                   json={"properties": {}, "routing_key": "c", "payload": "x", "payload_encoding": "string"})
    assert (await api.get("/api/queues?columns=name,messages")).json() == [
        {"name": "b", "messages": 0}, {"name": "a", "messages": 0}, {"name": "c", "messages": 1},
    ]
    assert (await api.get("/api/queues?columns=name,message_stats.publish")).json()[2] == {
        "name": "c", "message_stats": {"publish": 1},
    }
    page = (await api.get("/api/queues/%2F?page=2&page_size=2&sort=name")).json()
    assert {k: v for k, v in page.items() if k != "items"} == {
        "filtered_count": 3, "item_count": 1, "page": 2, "page_count": 2, "page_size": 2, "total_count": 3,
    }
    assert [item["name"] for item in page["items"]] == ["c"]
    page = (await api.get("/api/queues?page=1&sort=messages&sort_reverse=true&columns=name")).json()
    assert page["items"][0] == {"name": "c"}
    page = (await api.get("/api/queues?page=1&name=B&use_regex=false&columns=name")).json()
    assert page["items"] == [{"name": "b"}] and page["filtered_count"] == 1
    # no regular expressions (one could take exponential time)
    reply = await api.get("/api/queues?page=1&name=%5E%28a%2B%29%2B%24&use_regex=true")
    assert reply.status == 400 and "use_regex" in reply.json()["reason"]
    # RabbitMQ's other query parameters are ignored, not refused
    assert (await api.get("/api/queues?disable_stats=true&enable_queue_totals=true")).status == 200
    reply = await api.get("/api/queues?page=0")
    assert reply.status == 400 and reply.json()["error"] == "bad_request"


async def test_a_page_past_the_last_is_rabbitmqs_400(api: HTTPClient) -> None:
    for name in ("a", "b", "c"):
        await api.put(f"/api/queues/%2F/{name}", json={})
    # RabbitMQ's bound: the page right after a full last page is still an (empty) page
    page = (await api.get("/api/queues?page=4&page_size=1")).json()
    assert (page["items"], page["page_count"], page["filtered_count"]) == ([], 3, 3)
    for query, reason in [
        ("page=5&page_size=1", "Page out of range, page: 5 page size: 1, len: 3"),
        ("page=2", "Page out of range, page: 2 page size: 100, len: 3"),
        ("page=2&name=zz", "Page out of range, page: 2 page size: 100, len: 0"),  # len: the filtered
    ]:
        reply = await api.get(f"/api/queues?{query}")
        assert (reply.status, reply.json()) == (400, {"error": "page_out_of_range", "reason": reason}), query
    # the first page of nothing is a page (of no pages, as RabbitMQ counts them)
    page = (await api.get("/api/queues?page=1&name=zz")).json()
    assert (page["items"], page["page_count"], page["filtered_count"], page["total_count"]) == ([], 0, 0, 3)
    assert (await api.get("/api/exchanges?page=99")).json()["error"] == "page_out_of_range"


async def test_columns_apply_to_one_object_too(api: HTTPClient, clients: Clients) -> None:  # noqa: F811
    assert (await api.put("/api/queues/%2F/q", json={"arguments": {"x-max-length": 5}})).status == 201
    reply = await api.get("/api/queues/%2F/q?columns=name,messages,arguments")
    assert reply.json() == {"name": "q", "messages": 0, "arguments": {"x-max-length": 5}}
    assert (await api.get("/api/exchanges/%2F/amq.direct?columns=name,type")).json() == {"name": "amq.direct", "type": "direct"}
    node = (await api.get("/api/nodes?columns=name")).json()[0]["name"]
    assert (await api.get(f"/api/nodes/{node}?columns=name,running")).json() == {"name": node, "running": True}
    assert (await api.get("/api/vhosts/%2F?columns=name")).json() == {"name": "/"}
    assert (await api.get("/api/overview?columns=node,rates_mode")).json() == {"node": node, "rates_mode": "basic"}
    assert (await api.get("/api/whoami?columns=name")).json() == {"name": ""}
    # without columns: the whole object, as before
    assert (await api.get("/api/queues/%2F/q")).json()["state"] == "running"


async def test_columns_that_overlap_answer_and_change_nothing(api: HTTPClient) -> None:
    # a column inside another (arguments.a) must not write into the queue's own
    # arguments, and one inside a field that is not an object (name.x) is not a 500
    assert (await api.put("/api/queues/%2F/q", json={"arguments": {"x-max-length": 5}})).status == 201
    for columns in ("arguments,arguments.a.b", "arguments,arguments.x-max-length.y", "name,name.x", "name.x,name"):
        reply = await api.get(f"/api/queues?columns={columns}")
        assert reply.status == 200, (columns, reply.body)
    assert (await api.get("/api/queues?columns=name,name.x")).json() == [{"name": "q"}]
    assert (await api.get("/api/queues?columns=arguments,arguments.a")).json() == [{"arguments": {"x-max-length": 5}}]
    assert (await api.get("/api/queues/%2F/q")).json()["arguments"] == {"x-max-length": 5}
    # the queue's settings are unchanged: its twin declare still matches
    assert (await api.put("/api/queues/%2F/q", json={"arguments": {"x-max-length": 5}})).status == 204


async def test_connections_channels_and_consumers(api: HTTPClient, clients: Clients) -> None:  # noqa: F811
    await api.put("/api/queues/%2F/work", json={})
    ch = await clients.channel()
    await ch.ok({"op": "qos", "prefetch": 5})
    await ch.ok({"op": "consume", "queue": "work", "consumer_tag": "c1"})
    connections = (await api.get("/api/connections")).json()
    assert len(connections) == 1 and connections[0]["channels"] == 1 and connections[0]["vhost"] == "/"
    channels = (await api.get("/api/channels")).json()
    assert len(channels) == 1 and channels[0]["consumer_count"] == 1
    assert channels[0]["connection_details"]["name"] == connections[0]["name"]
    consumers = (await api.get("/api/consumers")).json()
    assert [(c["consumer_tag"], c["queue"], c["ack_required"]) for c in consumers] == [
        ("c1", {"name": "work", "vhost": "/"}, True),
    ]
    assert (await api.get("/api/consumers/%2F")).json() == consumers
    assert (await api.get("/api/queues/%2F/work")).json()["consumers"] == 1
    totals = (await api.get("/api/overview")).json()["object_totals"]
    assert (totals["connections"], totals["channels"], totals["consumers"]) == (1, 1, 1)
    # one of each by name, as RabbitMQ serves them; an unknown name is its 404
    name = quote(connections[0]["name"], safe="")
    assert (await api.get(f"/api/connections/{name}")).json() == connections[0]
    # (RabbitMQ answers these whole, columns or not)
    assert (await api.get(f"/api/connections/{name}?columns=name,channels")).json() == connections[0]
    assert (await api.get(f"/api/channels/{quote(channels[0]['name'], safe='')}")).json() == channels[0]
    for path in ("/api/connections/nope", "/api/channels/nope"):
        reply = await api.get(path)
        assert (reply.status, reply.json()) == (404, {"error": "Object Not Found", "reason": "Not Found"}), path


async def test_another_nodes_channels_here_are_not_connections(api: HTTPClient, clients: Clients) -> None:  # noqa: F811
    # a cluster member's channel for its client's consumer (or its forwarded
    # publishes) carries the forwarding marker: the cluster's plumbing, listed on
    # the client's own node, not here
    await api.put("/api/queues/%2F/work", json={})
    mine = await clients.channel()
    await mine.ok({"op": "consume", "queue": "work", "consumer_tag": "mine"})
    relay = await clients.channel(headers=[("X-Ackbus-Forwarded", "b")])
    await relay.ok({"op": "consume", "queue": "work", "consumer_tag": "relayed"})
    assert len((await api.get("/api/connections")).json()) == 1
    assert len((await api.get("/api/channels")).json()) == 1
    assert (await api.get("/api/overview")).json()["object_totals"]["connections"] == 1


async def test_who_is_connected_needs_the_administrator_tag(api: HTTPClient, broker: MemoryBroker) -> None:  # noqa: F811
    add_user(broker.runtime.core, "admin", tags=("administrator",))
    user = add_user(broker.runtime.core, "worker")
    await broker.runtime.wait_durable()
    for path in ("/api/connections", "/api/channels", "/api/consumers"):
        reply = await api.get(path, headers=user)
        assert (reply.status, reply.json()["error"]) == (401, "not_authorised"), path
    # what GET /queues reads, any user reads
    assert (await api.get("/api/queues", headers=user)).status == 200
    assert (await api.get("/api/whoami", headers=user)).json() == {"name": "worker", "tags": []}


async def test_the_queue_list_under_the_paths_tools_use(api: HTTPClient) -> None:
    await api.put("/api/queues/%2F/q", json={})
    expected = (await api.get("/api/queues")).json()
    # Flower's path for the vhost "/" (tests/api/test_management_flower.py)
    assert (await api.get("/api/queues/")).json() == expected
