"""The small pure pieces: confirm tracker, record codecs, property checks (the dedup
window has tests/core/test_dedup.py)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import InvalidArgument, check_properties
from broker.core.confirms import ConfirmTracker
from broker.core.records import (
    decode_dedup,
    decode_dedup_batch,
    decode_enqueue,
    decode_json,
    decode_seqs,
    encode_dedup,
    encode_dedup_batch,
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
