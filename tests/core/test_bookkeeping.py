"""The small pure pieces: confirm tracker, dedup window, record codecs, property checks."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import InvalidArgument, check_properties
from broker.core.confirms import ConfirmTracker
from broker.core.dedup import DedupWindow
from broker.core.records import (
    decode_dedup,
    decode_enqueue,
    decode_json,
    decode_seqs,
    encode_dedup,
    encode_dedup_batch,
    decode_dedup_batch,
    encode_enqueue,
    encode_json,
    encode_seqs,
)

# ------------------------------------------------------------ ConfirmTracker


def test_tracker_releases_in_order_and_coalesces() -> None:
    t = ConfirmTracker()
    t.add(1, 0)
    t.add(2, 5)
    t.add(3, 0)
    t.add(4, 0, False, "full")
    t.add(5, 7)
    t.add(6, 0)
    assert t.release(0) == [(1, False, True, None)]
    assert t.release(4) == []
    assert t.release(5) == [(3, True, True, None), (4, False, False, "full")]
    assert t.release(100) == [(6, True, True, None)]
    assert len(t) == 0


def test_tracker_fail_lsns() -> None:
    t = ConfirmTracker()
    t.add(1, 3)
    t.add(2, 4)
    t.add(3, 9)
    assert t.fail_lsns(4, 8, "disk") is True
    assert t.fail_lsns(20, 30, "disk") is False
    assert t.release(3) == [(1, False, True, None), (2, False, False, "disk")]
    assert t.release(8) == []
    assert t.release(9) == [(3, False, True, None)]


def test_tracker_nack_all() -> None:
    t = ConfirmTracker()
    t.add(1, 3)
    t.add(2, 0)
    assert t.nack_all("closed") == [(1, False, False, "closed"), (2, False, False, "closed")]
    assert len(t) == 0 and t.release(10) == []


@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(st.tuples(st.integers(0, 6), st.booleans()), max_size=30),
    durables=st.lists(st.integers(0, 8), max_size=6),
)
def test_tracker_property(items: list[tuple[int, bool]], durables: list[int]) -> None:
    t = ConfirmTracker()
    for tag, (lsn, ack) in enumerate(items, start=1):
        t.add(tag, lsn, ack, None if ack else "no")
    settled: dict[int, bool] = {}
    last = 0
    high = 0
    for d in [*durables, 10]:
        high = max(high, d)
        for tag, multiple, ack, _reason in t.release(d):
            assert tag > last
            tags = range(last + 1, tag + 1) if multiple else [tag]
            assert multiple or tag == last + 1
            for x in tags:
                lsn, want_ack = items[x - 1]
                assert want_ack == ack
                assert lsn <= d
                settled[x] = ack
            last = tag
    assert sorted(settled) == list(range(1, len(items) + 1))


# ---------------------------------------------------------------- DedupWindow


def test_dedup_window() -> None:
    w = DedupWindow(10)
    assert w.lookup("x", "a", 100) is None
    w.remember("x", "a", 100, 7)
    assert w.lookup("x", "a", 105) == 7
    assert w.lookup("y", "a", 105) is None
    assert w.lookup("x", "a", 110) == 7  # exactly at the edge: still inside
    assert w.lookup("x", "a", 110.5) is None
    assert len(w) == 0
    w.remember("x", "b", 200, 1)
    w.forget("x", "b")
    assert w.lookup("x", "b", 200) is None
    w.forget("x", "never")


def test_dedup_rememember_refreshes() -> None:
    w = DedupWindow(10)
    w.remember("x", "a", 100, 1)
    w.remember("x", "a", 108, 2)
    assert w.lookup("x", "a", 115) == 2  # the old order entry must not evict the new one
    assert w.entries() == [("x", "a", 108)]


def test_dedup_expires_in_batches_but_answers_exactly() -> None:
    w = DedupWindow(64)  # prunes at most once a second
    for i in range(100):
        w.remember("x", f"m{i}", 1000 + i * 0.1, i + 1)
    w.remember("y", "other", 1000, 500)
    assert len(w) == 101
    # At 1069.05 the window starts at 1005.05: m0..m50 are expired, m51.. are not.
    assert w.lookup("x", "m50", 1069.05) is None
    assert w.lookup("x", "m51", 1069.05) == 52
    assert w.lookup("y", "other", 1069.05) is None
    assert len(w) == 49  # the batch prune dropped every expired entry, of every exchange
    w.remember("x", "late", 1069.1, 0)
    assert [mid for _, mid, _ in w.entries()][-2:] == ["m99", "late"]
    # Entries expiring before the next batch are still refused by the exact check.
    assert w.lookup("x", "m52", 1069.3) is None
    assert w.lookup("x", "m53", 1069.3) == 54
    w.prune(2000)
    assert len(w) == 0 and w.entries() == []


def test_dedup_batches_split_per_exchange_in_time_order() -> None:
    w = DedupWindow(100)
    for i in range(5):
        w.remember("x", f"m{i}", 10 + i, 0)
    w.remember("y", "n", 10.25, 0)
    assert w.batches(2) == [
        ("x", [("m0", 10.0), ("m1", 11.0)]),
        ("x", [("m2", 12.0), ("m3", 13.0)]),
        ("x", [("m4", 14.0)]),
        ("y", [("n", 10.25)]),
    ]


def test_dedup_disabled() -> None:
    w = DedupWindow(0)
    w.remember("x", "a", 100, 1)
    assert w.lookup("x", "a", 100) is None and w.entries() == []


# ------------------------------------------------------------------ records

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)  # no lone surrogates


@settings(max_examples=150, deadline=None)
@given(
    seq=st.integers(0, 2**64 - 1),
    wall=st.floats(0, 2e9, allow_nan=False),
    expires=st.one_of(st.none(), st.floats(1, 2e9, allow_nan=False)),
    qids=st.lists(st.integers(0, 2**32 - 1), max_size=5),
    exchange=text,
    key=text,
    mid=st.one_of(st.none(), text.filter(bool)),
    props=st.one_of(st.none(), st.dictionaries(st.sampled_from(["content_type", "type"]), text, min_size=1)),
    body=st.binary(max_size=100),
)
def test_enqueue_roundtrip(
    seq: int,
    wall: float,
    expires: float | None,
    qids: list[int],
    exchange: str,
    key: str,
    mid: str | None,
    props: dict[str, Any] | None,
    body: bytes,
) -> None:
    r = decode_enqueue(encode_enqueue(seq, wall, expires, qids, exchange, key, mid, props, body))
    assert (r.seq, r.wall_s, r.expires_at, r.qids) == (seq, wall, expires, qids)
    assert (r.exchange, r.routing_key, r.message_id, r.properties, r.body) == (exchange, key, mid, props, body)


def test_seqs_and_dedup_and_json_roundtrip() -> None:
    assert decode_seqs(encode_seqs(7, [1, 2**63])) == (7, (1, 2**63))
    assert decode_seqs(encode_seqs(1, [])) == (1, ())
    with pytest.raises(ValueError):
        decode_seqs(encode_seqs(7, [1, 2])[:-8])
    assert decode_dedup(encode_dedup("ex", "id", 12.5)) == ("ex", "id", 12.5)
    assert decode_dedup_batch(encode_dedup_batch("ex", [("a", 1.5), ("b", 2.0)])) == ("ex", [("a", 1.5), ("b", 2.0)])
    with pytest.raises(ValueError):
        decode_dedup_batch(b'[1, 2]')
    assert decode_json(encode_json({"a": [1]})) == {"a": [1]}
    with pytest.raises(ValueError):
        decode_json(b"[1, 2]")


# --------------------------------------------------------- check_properties


def test_check_properties_accepts() -> None:
    assert check_properties(None) is None
    assert check_properties({}) is None
    assert check_properties({"content_type": None}) is None
    full = {
        "content_type": "a/b",
        "content_encoding": "gzip",
        "headers": {"x": [1]},
        "delivery_mode": 1,
        "priority": 255,
        "correlation_id": "c",
        "reply_to": "r",
        "expiration": 0,
        "message_id": "m" * 255,
        "timestamp": 1,
        "type": "t",
        "app_id": "a",
        "user_id": "u",
        "cluster_id": "k",
    }
    assert check_properties(dict(full)) == full
    assert check_properties({"type": "x", "app_id": None}) == {"type": "x"}


@pytest.mark.parametrize(
    "props",
    [
        [],
        "x",
        {"unknown": 1},
        {"content_type": 5},
        {"message_id": "m" * 256},
        {"message_id": "€" * 100},  # 100 characters, 300 bytes
        {"message_id": "\ud800"},
        {"headers": []},
        {"delivery_mode": 3},
        {"delivery_mode": True},
        {"priority": 256},
        {"priority": -1},
        {"priority": False},
        {"expiration": -1},
        {"expiration": "100"},
        {"timestamp": 1.5},
    ],
)
def test_check_properties_rejects(props: Any) -> None:
    with pytest.raises(InvalidArgument):
        check_properties(props)
