"""The etcd client: its pure request/answer functions, and every call against a real
etcd (skipped, with the reason, when etcd is not installed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from broker.cluster.etcd import EtcdClient, WatchMoved, parse_endpoints
from broker.cluster.etcdproto import (
    CompareCreate,
    EtcdUnavailable,
    OpGet,
    OpPut,
    parse_error,
    parse_keepalive,
    parse_txn,
    parse_watch,
    prefix_end,
    txn_body,
)
from tests.cluster.silent_proxy import SilentProxy
from tests.support.broker import free_port
from tests.support.etcd import EtcdProcess, require_etcd

# ------------------------------------------------------------------------ sans IO


def test_prefix_end_covers_the_prefix() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


def test_txn_body_encodes_keys_and_revisions_as_the_gateway_wants() -> None:
    body = txn_body([CompareCreate(b"k")], [OpPut(b"k", b"v", lease=7)], [OpGet(b"k")])
    assert body["compare"] == [{"key": "aw==", "target": "CREATE", "result": "EQUAL", "create_revision": "0"}]
    assert body["success"] == [{"request_put": {"key": "aw==", "value": "dg==", "lease": "7"}}]
    assert body["failure"] == [{"request_range": {"key": "aw=="}}]


def test_a_failed_txn_has_no_succeeded_field_and_returns_its_ranges() -> None:
    answer = {
        "header": {"revision": "9"},
        "responses": [{"response_range": {"kvs": [{"key": "aw==", "value": "dg==", "create_revision": "3", "mod_revision": "5"}]}}],
    }
    result = parse_txn(answer)
    assert not result.succeeded and result.revision == 9
    assert result.ranges[0][0].value == b"v" and result.ranges[0][0].create_revision == 3


def test_a_keepalive_of_a_lost_lease_has_no_ttl() -> None:
    assert parse_keepalive({"result": {"ID": "5", "TTL": "3"}}) == 3
    assert parse_keepalive({"result": {"ID": "5"}}) == 0


def test_watch_messages() -> None:
    batch = parse_watch({"result": {"header": {"revision": "4"}, "events": [{"type": "DELETE", "kv": {"key": "aw==", "mod_revision": "4"}}]}})
    assert batch.revision == 4 and batch.events[0].deleted and batch.events[0].kv.key == b"k"
    gone = parse_watch({"result": {"canceled": True, "compact_revision": "2"}})
    assert gone.canceled and gone.compacted == 2


def test_unavailable_codes_are_their_own_error() -> None:
    assert isinstance(parse_error({"error": "x", "message": "x", "code": 14}), EtcdUnavailable)
    assert not isinstance(parse_error({"error": "x", "message": "x", "code": 3}), EtcdUnavailable)


def test_endpoints_are_http_or_https_urls_of_one_scheme() -> None:
    assert [e.port for e in parse_endpoints("http://127.0.0.1:1, http://127.0.0.1:2/")] == [1, 2]
    assert [(e.host, e.port, e.tls) for e in parse_endpoints("https://h:1,https://g")] == [("h", 1, True), ("g", 2379, True)]
    for bad in ("ftp://h:1", "127.0.0.1:2379", "http://h:1/path", "", "http://h:1,https://g:2"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


# ------------------------------------------------------------------- a real etcd


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    require_etcd()
    with EtcdProcess(tmp_path / "etcd") as proc:
        yield proc


async def test_kv_txn_and_delete(etcd: EtcdProcess) -> None:
    client = EtcdClient(parse_endpoints(etcd.url))
    try:
        rev = await client.put(b"/t/a", b"1")
        assert rev > 0
        first = await client.txn([CompareCreate(b"/t/b")], [OpPut(b"/t/b", b"2")], [OpGet(b"/t/b")])
        assert first.succeeded
        second = await client.txn([CompareCreate(b"/t/b")], [OpPut(b"/t/b", b"3")], [OpGet(b"/t/b")])
        assert not second.succeeded and second.ranges[0][0].value == b"2"
        revision, kvs = await client.get_prefix(b"/t/")
        assert revision == second.revision and [kv.key for kv in kvs] == [b"/t/a", b"/t/b"]
        await client.delete(b"/t/", prefix=True)
        assert (await client.get(b"/t/a"))[1] is None
    finally:
        await client.aclose()


async def test_leases_expire_and_a_lost_lease_keeps_alive_to_zero(etcd: EtcdProcess) -> None:
    client = EtcdClient(parse_endpoints(etcd.url))
    try:
        lease = await client.lease_grant(5)
        await client.put(b"/t/live", b"x", lease=lease)
        assert await client.lease_keepalive(lease) == 5
        await client.lease_revoke(lease)
        assert (await client.get(b"/t/live"))[1] is None  # went with its lease
        assert await client.lease_keepalive(lease) == 0
        await client.lease_revoke(lease)  # already gone: not an error
    finally:
        await client.aclose()


async def test_watch_from_a_revision_and_compaction(etcd: EtcdProcess) -> None:
    client = EtcdClient(parse_endpoints(etcd.url))
    try:
        start = await client.put(b"/w/a", b"1")
        await client.put(b"/w/a", b"2")
        seen = []
        with trio.fail_after(10):
            async with client.watch(b"/w/", start) as stream:
                async for batch in stream:
                    seen.extend((e.deleted, e.kv.value) for e in batch.events)
                    if len(seen) == 2:
                        await client.delete(b"/w/a")
                    if len(seen) == 3:
                        break
        assert seen == [(False, b"1"), (False, b"2"), (True, b"")]
        latest = await client.put(b"/w/b", b"3")
        await client.call("/v3/kv/compaction", {"revision": str(latest)})
        with trio.fail_after(10):
            async with client.watch(b"/w/", start) as stream:
                batch = await stream.__anext__()
                while batch.created and not batch.compacted:
                    batch = await stream.__anext__()
        assert batch.compacted == latest
    finally:
        await client.aclose()


async def test_failover_to_the_next_endpoint_and_a_clear_error_when_none_answers(etcd: EtcdProcess) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    client = EtcdClient(parse_endpoints(f"{dead},{etcd.url}"), timeout_s=2)
    try:
        await client.put(b"/f/a", b"1")
        assert client.endpoints[0].healthy is False and client.endpoints[1].healthy is True
    finally:
        await client.aclose()
    nobody = EtcdClient(parse_endpoints(dead), timeout_s=2)
    with pytest.raises(EtcdUnavailable, match=dead.replace(".", r"\.")):
        await nobody.get(b"/f/a")


async def test_a_kept_alive_connection_that_died_with_etcd_is_replaced(etcd: EtcdProcess) -> None:
    client = EtcdClient(parse_endpoints(etcd.url), timeout_s=5)
    try:
        await client.put(b"/r/a", b"1")
        assert client._idle  # kept alive
        await trio.to_thread.run_sync(etcd.stop)
        await trio.to_thread.run_sync(etcd.start)
        assert (await client.get(b"/r/a"))[1] is not None  # no EtcdUnavailable on the first call
    finally:
        await client.aclose()


async def test_a_call_with_no_answer_moves_the_next_call_and_the_watch_to_another_endpoint(etcd: EtcdProcess) -> None:
    etcd_port = int(etcd.url.rsplit(":", 1)[1])
    proxy = SilentProxy(etcd_port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        client = EtcdClient(parse_endpoints(f"http://127.0.0.1:{proxy.port},{etcd.url}"), timeout_s=1)
        other = EtcdClient(parse_endpoints(etcd.url))
        try:
            start = await client.put(b"/m/a", b"1")
            assert client.preferred is client.endpoints[0]  # through the proxy
            moved: list[BaseException] = []
            seen: list[bytes] = []

            async def follow() -> None:
                async with client.watch(b"/m/", start) as stream:
                    try:
                        async for batch in stream:
                            seen.extend(e.kv.value for e in batch.events)
                    except WatchMoved as exc:
                        moved.append(exc)

            nursery.start_soon(follow)
            with trio.fail_after(10):
                while seen != [b"1"]:
                    await trio.sleep(0.01)
            proxy.silent = True  # the watch's member is cut off: its stream just stops
            await other.put(b"/m/b", b"2")
            with pytest.raises(EtcdUnavailable, match="no answer"):
                await client.get(b"/m/b")  # sent, never answered: not repeated elsewhere
            with trio.fail_after(5):
                while not moved:
                    await trio.sleep(0.01)  # the watch's read ended at once
            assert seen == [b"1"] and "moved" in str(moved[0])
            assert (await client.get(b"/m/b"))[1] is not None  # the next call went elsewhere
            assert client.preferred is client.endpoints[1]
            with trio.fail_after(10):
                async with client.watch(b"/m/", start + 1) as stream:  # watched again there
                    batch = await stream.__anext__()
                    while not batch.events:
                        batch = await stream.__anext__()
            assert [e.kv.value for e in batch.events] == [b"2"]
        finally:
            await client.aclose()
            await other.aclose()
            nursery.cancel_scope.cancel()
