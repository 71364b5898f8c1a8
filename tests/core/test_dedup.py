"""The publish deduplication window: exact window, refresh, forget, batch pruning, the
hash table under many inserts and deletes (against a dict model), checkpoint payloads."""

from __future__ import annotations

import random
import struct
from hashlib import blake2b

import pytest

from broker.core import dedup as dedup_module
from broker.core import dedupkeys
from broker.core.dedup import DedupWindow, digest, digest_utf8


def _window_with(*entries: tuple[str, str, float]) -> DedupWindow:
    w = DedupWindow(1000)
    for exchange, mid, wall in entries:
        w.remember(exchange, mid, wall, 0)
    return w


# ------------------------------------------------------------------ digest


def test_digest_is_blake2b_of_exchange_and_id_and_stable() -> None:
    # pinned: the digest is written to checkpoints, changing it loses the window
    assert digest("amq.direct", "c0ffee12-ab34-1234567") == 0xC1051635C830D952
    for exchange, mid in [("amq.direct", "a"), ("", "a"), ("x", ""), ("ex", "é✓")]:
        raw = blake2b((exchange + "\0" + mid).encode(), digest_size=8).digest()
        assert digest(exchange, mid) == int.from_bytes(raw, "little")
        # recovery's form, from the UTF-8 in the records, is the same key
        assert digest_utf8(exchange.encode(), mid.encode()) == digest(exchange, mid)
    assert digest("a", "b") != digest("b", "a")
    assert digest("", "ab") != digest("a", "b")


def test_digest_stays_right_when_the_exchange_cache_is_cleared() -> None:
    names = [f"ex{i}" for i in range(3 * dedupkeys._PREFIXES_MAX)]
    first = [digest(name, "m") for name in names]
    assert len(dedupkeys._PREFIXES) <= dedupkeys._PREFIXES_MAX
    assert [digest(name, "m") for name in reversed(names)] == first[::-1]
    assert first[0] == int.from_bytes(blake2b(b"ex0\0m", digest_size=8).digest(), "little")


class _FixedHash:
    """Stands in for a BLAKE2b state whose digest is ``value``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def copy(self) -> _FixedHash:
        return self

    def update(self, data: bytes) -> None:
        pass

    def digest(self) -> bytes:
        return self.value.to_bytes(8, "little")


@pytest.mark.parametrize(("raw", "expected"), [(0, 2), (1, 3), (2, 2), (2**64 - 1, 2**64 - 1)])
def test_reserved_digests_are_moved(monkeypatch: pytest.MonkeyPatch, raw: int, expected: int) -> None:
    monkeypatch.setattr(dedupkeys, "_PREFIXES", {"fixed": _FixedHash(raw)})
    assert digest("fixed", "anything") == expected
    w = DedupWindow(10)
    w.remember("fixed", "m", 100, 0)
    assert w.lookup("fixed", "m", 100) == 0
    assert w.digests() == [(expected, 100_000)]


# ------------------------------------------------------------ window rules


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


def test_exact_window_at_the_millisecond() -> None:
    w = DedupWindow(10)
    w.remember("x", "a", 100.0, 0)
    w.remember("x", "b", 100.001, 0)
    assert w.lookup("x", "a", 110.0004) == 0  # rounds to 110.000: on the edge, inside
    assert w.lookup("x", "b", 110.001) == 0
    assert w.lookup("x", "a", 110.001) is None  # one millisecond out
    assert w.lookup("x", "b", 110.002) is None
    assert len(w) == 0  # an expired hit is dropped


def test_expired_hit_is_dropped_even_between_batch_prunes() -> None:
    w = DedupWindow(64)
    w.remember("x", "a", 100, 0)
    w.remember("x", "b", 100.5, 0)
    assert w.lookup("x", "nothing", 163.9) is None  # a batch prune: nothing expired yet
    assert len(w) == 2
    assert w.lookup("x", "a", 164.3) is None  # before the next batch, exact anyway
    assert len(w) == 1
    assert w.lookup("x", "b", 164.3) == 0


def test_dedup_remember_refreshes() -> None:
    w = DedupWindow(10)
    w.remember("x", "a", 100, 1)
    w.remember("x", "a", 108, 2)
    assert len(w) == 1
    assert w.lookup("x", "a", 115) == 2  # the old order entry must not evict the new one
    assert w.digests() == [(digest("x", "a"), 108_000)]
    w.prune(117)  # the stale FIFO item (time 100) is long expired: it must not delete "a"
    assert w.lookup("x", "a", 117) == 2
    w.remember("x", "a", 109, 0)  # a refresh may also clear the LSN
    assert w.lookup("x", "a", 118) == 0


def test_forget() -> None:
    w = DedupWindow(10)
    for i in range(50):
        w.remember("x", f"m{i}", 100, i + 1)
    w.forget("x", "m7")
    w.forget("y", "m8")  # another exchange: not the same entry
    w.forget("x", "m7")
    assert len(w) == 49
    assert w.lookup("x", "m7", 101) is None
    assert w.lookup("x", "m8", 101) == 9
    assert all(w.lookup("x", f"m{i}", 101) == i + 1 for i in range(50) if i != 7)
    # a forgotten then remembered id: its stale FIFO item must not drop the new entry
    w.remember("x", "m7", 105, 70)
    w.prune(111)
    assert w.lookup("x", "m7", 111) == 70
    assert all(w.lookup("x", f"m{i}", 111) is None for i in range(50) if i != 7)
    assert len(w) == 1


def test_lookup_remember_pairs_use_the_right_digest() -> None:
    # remember() reuses the digest of the lookup just before when it is for the same id
    w = DedupWindow(10)
    assert w.lookup("x", "a", 100) is None
    w.remember("y", "a", 100, 1)  # another exchange than the lookup's
    assert w.lookup("x", "a", 100) is None
    assert w.lookup("y", "a", 100) == 1
    mid = "".join(["b", "c"])  # equal, not identical, to the id looked up
    assert w.lookup("x", "bc", 100) is None
    w.remember("x", mid, 100, 2)
    assert w.lookup("x", "bc", 100) == 2
    w.remember("x", "other", 100, 3)
    assert w.lookup("x", "other", 100) == 3


def test_dedup_disabled() -> None:
    for window_s in (0, -5):
        w = DedupWindow(window_s)
        w.remember("x", "a", 100, 1)
        w.remember_digest(digest("x", "b"), 100, 1)
        assert w.lookup("x", "a", 100) is None and w.digests() == [] and len(w) == 0
        w.load_payload(_window_with(("x", "c", 100)).checkpoint_payloads(10)[0])
        assert len(w) == 0 and w.checkpoint_payloads(10) == []


def test_lsn_is_exact_while_recent_and_never_too_early_when_old() -> None:
    mod = dedup_module._LSN_MOD
    w = DedupWindow(1000)
    big = 5 * 2**40 + 12345
    w.remember("x", "a", 100, big)
    w.remember("x", "zero", 100, 0)
    assert w.lookup("x", "a", 100) == big
    assert w.lookup("x", "zero", 100) == 0
    w.remember("x", "b", 100, big + mod - 1)
    assert w.lookup("x", "a", 100) == big  # still within the tag's range
    w.remember("x", "c", 100, big + 3 * mod + 7)
    top = big + 3 * mod + 7
    old = w.lookup("x", "a", 100)
    # a later LSN than its own with the same tag, never one not yet issued
    assert old is not None and big < old <= top and (old - big) % mod == 0
    assert w.lookup("x", "c", 100) == top
    assert w.lookup("x", "zero", 100) == 0


def test_times_before_1970_are_clamped() -> None:
    w = DedupWindow(10)
    w.remember("x", "a", -3, 0)
    assert w.digests() == [(digest("x", "a"), 0)]
    assert w.lookup("x", "a", 5) == 0
    assert w.lookup("x", "a", 10.001) is None


# ----------------------------------------------------------------- pruning


def test_dedup_expires_in_batches_but_answers_exactly() -> None:
    w = DedupWindow(64)  # prunes at most once a second
    w.remember("y", "other", 1000, 500)
    for i in range(100):
        w.remember("x", f"m{i}", 1000 + i * 0.1, i + 1)
    assert len(w) == 101
    # At 1069.05 the window starts at 1005.05: m0..m50 are expired, m51.. are not.
    assert w.lookup("x", "m50", 1069.05) is None
    assert w.lookup("x", "m51", 1069.05) == 52
    assert w.lookup("y", "other", 1069.05) is None
    assert len(w) == 49  # the batch prune dropped every expired entry, of every exchange
    w.remember("x", "late", 1069.1, 0)
    assert [d for d, _ in w.digests()][-2:] == [digest("x", "m99"), digest("x", "late")]
    # Entries expiring before the next batch are still refused by the exact check.
    assert w.lookup("x", "m52", 1069.3) is None
    assert w.lookup("x", "m53", 1069.3) == 54
    w.prune(2000)
    assert len(w) == 0 and w.digests() == []


def test_entries_are_freed_only_at_the_batch_cadence() -> None:
    w = DedupWindow(6.4)  # a batch at most every 100 ms
    for i in range(1000):
        w.remember("x", f"m{i}", 100 + i * 0.001, 0)  # 100.000 .. 100.999
    assert w.lookup("x", "none", 106.5) is None  # batch: drops m0..m99 (before 100.1)
    assert len(w) == 900
    held = 900
    for t in (106.55, 106.59, 106.599):  # no batch before 106.6: nothing freed...
        assert w.lookup("x", "none", t) is None
        assert len(w) == held
        # ...but lookups answer exactly: m100..m(t - 6.4) are out, the next one in
        edge = round((t - 6.4 - 100) * 1000)
        assert w.lookup("x", f"m{edge}", t) == 0
        assert w.lookup("x", f"m{edge - 1}", t) is None  # and dropped
        held -= 1
        assert len(w) == held
    assert len(w) == 897
    assert w.lookup("x", "none", 106.6) is None  # next batch: below 100.2 all gone
    assert len(w) == 800
    assert w.lookup("x", "m200", 106.6) == 0


def test_stale_items_in_a_wholly_expired_chunk_keep_refreshed_entries() -> None:
    chunk = dedup_module._CHUNK
    w = DedupWindow(10)
    for i in range(3 * chunk):
        w.remember("x", f"m{i}", 100 + i * 0.0001, i + 1)
    # refresh every 7th entry of the first chunk much later, forget every 11th
    for i in range(0, chunk, 7):
        w.remember("x", f"m{i}", 115, 0)
    for i in range(0, 2 * chunk, 11):
        w.forget("x", f"m{i}")
    assert w.lookup("x", "none", 115) is None  # prune: the first chunks wholly expired
    refreshed = {f"m{i}" for i in range(0, chunk, 7) if i % 11}
    assert len(w) == len(refreshed)
    for i in range(3 * chunk):
        assert w.lookup("x", f"m{i}", 115) == (0 if f"m{i}" in refreshed else None)
    assert sorted(w.digests()) == sorted((digest("x", m), 115_000) for m in refreshed)


def test_stale_items_in_a_partly_expired_chunk_keep_refreshed_entries() -> None:
    chunk = dedup_module._CHUNK
    w = DedupWindow(10)
    for i in range(10):
        w.remember("x", f"m{i}", 100 + i, i + 1)  # 100 .. 109
    for i in range(10, chunk):
        w.remember("x", f"m{i}", 109.9, 0)  # fills the first chunk: newest 109.9
    w.remember("x", "m2", 110.5, 33)  # refreshed in the next chunk: m2's first item is stale
    w.prune(114.5)  # horizon 104.5: m0, m1, m3, m4 expire; m2 must stay
    assert len(w) == chunk - 4
    # m0..m4's items are consumed (m2's too: its entry is newer than the chunk), m5's not
    assert w._head == 5 and sum(map(len, w._chunks)) - w._head == chunk - 5 + 1
    assert [w.lookup("x", f"m{i}", 114.5) for i in range(10)] == [
        None, None, 33, None, None, 6, 7, 8, 9, 10
    ]
    w.prune(119.95)  # horizon 109.95: all but m2 are out
    assert w.digests() == [(digest("x", "m2"), 110_500)]


def test_refresh_within_a_chunk_does_not_hold_back_expired_entries() -> None:
    w = DedupWindow(10)
    w.remember("x", "a", 100, 0)
    w.remember("x", "b", 101, 0)
    w.remember("x", "a", 105, 0)  # refreshed within the same chunk
    w.remember("x", "c", 106, 0)
    w.remember("x", "d", 120, 0)
    w.prune(112.5)  # horizon 102.5: b has expired, behind a's first (stale) item
    assert len(w) == 3
    assert w.digests() == [
        (digest("x", "a"), 105_000), (digest("x", "c"), 106_000), (digest("x", "d"), 120_000)
    ]
    w.prune(130)  # horizon 120: all but d are out
    assert w.digests() == [(digest("x", "d"), 120_000)]


def test_memory_is_given_back_after_a_big_prune() -> None:
    w = DedupWindow(10)
    assert w.slots() == dedup_module._MIN_SLOTS
    for i in range(20_000):
        w.remember("x", f"m{i}", 100 + i * 0.001, 0)  # 100.000 .. 119.999
    big = w.slots()
    assert 20_000 <= big * 0.7 and big <= 2 * 20_000 / 0.7  # grew, by doubling
    w.prune(129)  # horizon 119: m19000.. stay
    assert len(w) == 1000
    assert w.slots() <= big // 4  # rebuilt smaller
    assert w.slots() >= 2 * len(w)
    assert all(w.lookup("x", f"m{i}", 129) == 0 for i in range(19_000, 20_000))
    w.prune(200)
    assert len(w) == 0 and w.slots() == dedup_module._MIN_SLOTS
    assert len(w._chunks) == 1 and len(w._chunks[0]) == 0  # the FIFO is empty too


def _ids_by_home(homes: list[int], per_home: int) -> dict[int, list[str]]:
    """Message ids (exchange "x") whose digests have these home slots in the smallest
    table, found by trying ids in turn (real digests: the window's code is compiled in
    the compiled build, where patching its module's ``digest`` would not reach it)."""
    slots = dedup_module._MIN_SLOTS
    found: dict[int, list[str]] = {home: [] for home in homes}
    i = 0
    while any(len(ids) < per_home for ids in found.values()):
        i += 1
        ids = found.get(digest("x", f"w{i}") % slots)
        if ids is not None and len(ids) < per_home:
            ids.append(f"w{i}")
    return found


@pytest.mark.parametrize("how", ["forget", "expired lookup", "prune"])
def test_deletions_keep_wrapping_clusters_reachable(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    # Digests whose home slots are the last and first ones of the table, so that their
    # cluster wraps around; deleting members in any order (each way of deleting has its
    # own loop) must keep every other one reachable.
    monkeypatch.setattr(dedup_module, "_CHUNK", 4)
    slots = dedup_module._MIN_SLOTS
    homes = [slots - 3, slots - 2, slots - 1, 0, 1, 5]
    pool = _ids_by_home(homes, 8)
    rng = random.Random(7)
    for _round in range(40):
        w = DedupWindow(100)
        entries = [mid for home in homes for mid in rng.sample(pool[home], 4)]
        rng.shuffle(entries)
        for mid in entries:
            w.remember("x", mid, 1000, 0)
        assert sorted(d for d, _ in w.digests()) == sorted(digest("x", mid) for mid in entries)
        doomed = rng.sample(entries, 13)
        kept = set(entries) - set(doomed)
        if how == "forget":
            for mid in doomed:
                w.forget("x", mid)
        elif how == "expired lookup":
            for mid in doomed:
                w.remember("x", mid, 500, 0)
            for mid in doomed:
                assert w.lookup("x", mid, 1000.5) is None
        else:
            # the kept ones refreshed later: the chunks of the first items expire whole
            for mid in kept:
                w.remember("x", mid, 1200, 0)
            w.prune(1150)
        assert sorted(d for d, _ in w.digests()) == sorted(digest("x", mid) for mid in kept)
        assert len(w) == len(kept)
        now = 1150 if how == "prune" else 1000.5
        assert all(w.lookup("x", mid, now) == 0 for mid in kept)
        assert all(w.lookup("x", mid, now) is None for mid in doomed)


# ---------------------------------------------------- against a dict model


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_operations_against_a_dict_model(seed: int) -> None:
    rng = random.Random(seed)
    window_s = 20.0
    window_ms = 20_000
    w = DedupWindow(window_s)
    model: dict[tuple[str, str], tuple[int, int]] = {}  # (exchange, id) -> (ms, lsn)
    ids = [f"id-{i}" for i in range(4000)]
    exchanges = ["", "amq.direct", "orders"]
    now = 1_700_000_000.0
    lsn = 0
    grew = shrank = False

    def model_prune(now_ms: int) -> None:
        for key, (ms, _) in list(model.items()):
            if ms < now_ms - window_ms:
                del model[key]

    def check_after_prune() -> None:
        # with a steady clock a prune leaves exactly the entries inside the window
        got = w.digests()
        assert len(w) == len(model)
        assert sorted(got) == sorted((digest(ex, mid), ms) for (ex, mid), (ms, _) in model.items())
        assert [ms for _, ms in got] == sorted(ms for _, ms in got)  # oldest first

    for step in range(12_000):
        phase = step // 4000  # slow clock (fills the table), fast clock, slow again
        now += rng.random() * (0.004 if phase != 1 else 0.05)
        now_ms = round(now * 1000)
        op = rng.random()
        key = (rng.choice(exchanges), rng.choice(ids))
        if op < 0.45:
            got = w.lookup(key[0], key[1], now)
            entry = model.get(key)
            if entry is not None and entry[0] < now_ms - window_ms:
                del model[key]
                entry = None
            assert got == (None if entry is None else entry[1]), (step, key)
            if got is None and rng.random() < 0.9:
                # The remember of a missed lookup inserts where the lookup's probe ended,
                # unless entries moved in between: make them move sometimes.
                between = rng.random()
                other = (rng.choice(exchanges), rng.choice(ids))
                if other != key and between < 0.1:
                    w.forget(other[0], other[1])
                    model.pop(other, None)
                elif other != key and between < 0.2:
                    lsn += 1
                    w.remember(other[0], other[1], now, lsn)
                    model[other] = (now_ms, lsn)
                elif between < 0.22:
                    w.prune(now)
                    model_prune(now_ms)
                lsn += 1
                new_lsn = lsn if rng.random() < 0.7 else 0
                w.remember(key[0], key[1], now, new_lsn)
                model[key] = (now_ms, new_lsn)
        elif op < 0.55:  # remember without lookup: refreshes entries present
            lsn += 1
            w.remember(key[0], key[1], now, lsn)
            model[key] = (now_ms, lsn)
        elif op < 0.62:
            w.forget(key[0], key[1])
            model.pop(key, None)
        elif op < 0.625:
            w.prune(now)
            model_prune(now_ms)
            check_after_prune()
            assert all(w.lookup(ex, mid, now) == v[1] for (ex, mid), v in model.items())
        grew = grew or w.slots() > dedup_module._MIN_SLOTS
        shrank = shrank or (grew and w.slots() == dedup_module._MIN_SLOTS)
    assert grew and shrank
    now += 2 * window_s
    w.prune(now)
    model_prune(round(now * 1000))
    check_after_prune()
    assert len(w) == 0 and w.slots() == dedup_module._MIN_SLOTS


@pytest.mark.parametrize("seed", [4, 5])
def test_prunes_are_exact_at_a_high_rate(seed: int) -> None:
    # a window of several chunks, ids coming back after they expired and a few refreshes
    rng = random.Random(seed)
    w = DedupWindow(1.0)
    model: dict[tuple[str, str], int] = {}
    now = 5000.0
    for step in range(30_000):
        now += rng.random() * 0.0002  # ~10 remembers a ms: ~3 chunks in the window
        key = (rng.choice(["a", "b"]), f"m{rng.randrange(20_000)}")
        if w.lookup(key[0], key[1], now) is None or rng.random() < 0.02:
            w.remember(key[0], key[1], now, 0)
            model[key] = round(now * 1000)
        if step % 3000 == 2999:
            w.prune(now)
            horizon = round(now * 1000) - 1000
            model = {k: ms for k, ms in model.items() if ms >= horizon}
            got = w.digests()
            assert len(w) == len(model)
            assert sorted(got) == sorted((digest(*k), ms) for k, ms in model.items())
            assert [ms for _, ms in got] == sorted(ms for _, ms in got)  # oldest first


# ------------------------------------------------------------- checkpoints


def _filled(n: int = 300) -> DedupWindow:
    w = DedupWindow(60)
    for i in range(n):
        w.remember(["x", "y", ""][i % 3], f"m{i}", 1000 + i * 0.01, i + 1)
    for i in range(0, n, 10):
        w.remember(["x", "y", ""][i % 3], f"m{i}", 1004, 0)  # refreshed: stale FIFO items
    for i in range(5, n, 25):
        w.forget(["x", "y", ""][i % 3], f"m{i}")
    return w


def test_checkpoint_round_trip() -> None:
    w = _filled()
    payloads = w.checkpoint_payloads(4096)
    assert len(payloads) == 1
    fresh = DedupWindow(60)
    for payload in payloads:
        fresh.load_payload(payload)
    assert fresh.digests() == w.digests()
    assert len(fresh) == len(w)
    times = [ms for _, ms in w.digests()]
    assert times == sorted(times)  # oldest first
    for t in (1030, 1062.5, 1063.9):
        for i in range(300):
            ex, mid = ["x", "y", ""][i % 3], f"m{i}"
            assert (fresh.lookup(ex, mid, t) is None) == (w.lookup(ex, mid, t) is None)
    assert fresh.digests() == w.digests()


def test_checkpoint_payloads_split_at_max_entries() -> None:
    w = DedupWindow(100)
    for i in range(7):
        w.remember("x", f"m{i}", 10 + i, 0)
    payloads = w.checkpoint_payloads(3)
    heads = [struct.unpack_from("<II", p) for p in payloads]
    assert heads == [(3, 7), (3, 4), (1, 1)]  # count, entries from this payload on
    assert [len(p) for p in payloads] == [8 + 48, 8 + 48, 8 + 16]
    first = payloads[0]
    assert struct.unpack_from("<3Q", first, 8) == tuple(digest("x", f"m{i}") for i in range(3))
    assert struct.unpack_from("<3Q", first, 32) == (10_000, 11_000, 12_000)
    fresh = DedupWindow(100)
    for payload in payloads:
        fresh.load_payload(payload)
    assert fresh.digests() == w.digests() == [(digest("x", f"m{i}"), (10 + i) * 1000) for i in range(7)]
    assert len(w.checkpoint_payloads(1)) == 7
    assert DedupWindow(100).checkpoint_payloads(5) == []
    with pytest.raises(ValueError):
        w.checkpoint_payloads(0)


def test_load_payload_is_idempotent_and_keeps_the_newer_time() -> None:
    w = _filled()
    payloads = w.checkpoint_payloads(50)
    fresh = DedupWindow(60)
    for payload in payloads + payloads:
        fresh.load_payload(payload)
    assert fresh.digests() == w.digests()
    assert len(fresh) == len(w)
    assert len(fresh._chunks[0]) == len(w)  # the second load added no FIFO items

    d = digest("x", "k")
    older = DedupWindow(60)
    older.remember_digest(d, 1000, 0)
    newer = DedupWindow(60)
    newer.remember_digest(d, 1010, 0)
    target = DedupWindow(60)
    target.remember("x", "k", 1005, 42)
    target.load_payload(older.checkpoint_payloads(10)[0])
    assert target.digests() == [(d, 1_005_000)]
    assert target.lookup("x", "k", 1006) == 42  # kept its own time and LSN
    target.load_payload(newer.checkpoint_payloads(10)[0])
    assert target.digests() == [(d, 1_010_000)]
    assert target.lookup("x", "k", 1066) == 0
    assert target.lookup("x", "k", 1070.001) is None  # the loaded time, not 1005, counts


def test_loaded_entries_expire_and_are_pruned() -> None:
    w = DedupWindow(10)
    for i in range(5000):
        w.remember("x", f"m{i}", 100 + i * 0.001, 0)  # 100.000 .. 104.999
    fresh = DedupWindow(10)
    for payload in w.checkpoint_payloads(1000):
        fresh.load_payload(payload)
    fresh.prune(112.5)  # horizon 102.5
    assert len(fresh) == 2500
    assert fresh.lookup("x", "m2499", 112.5) is None
    assert fresh.lookup("x", "m2500", 112.5) == 0
    fresh.remember("x", "new", 113, 5)
    fresh.prune(200)
    assert len(fresh) == 0


def test_malformed_payloads_are_refused() -> None:
    good = _window_with(("x", "a", 100), ("x", "b", 101)).checkpoint_payloads(10)[0]
    w = DedupWindow(1000)
    bad = [
        b"",
        b"\x01\x00",
        good[:-1],  # one byte short
        good + b"\0",  # one byte too many
        good[:-16],  # count 2, one entry
        struct.pack("<II", 1, 1) + struct.pack("<QQ", 0, 100_000),  # reserved digest
        struct.pack("<II", 1, 1) + struct.pack("<QQ", 1, 100_000),
        struct.pack("<II", 1, 1) + struct.pack("<QQ", 77, 2**44),  # time beyond 44 bits
        struct.pack("<II", 2**32 - 1, 0) + bytes(16),
    ]
    for payload in bad:
        with pytest.raises(ValueError):
            w.load_payload(payload)
    assert len(w) == 0 and w.digests() == []
    w.load_payload(struct.pack("<II", 0, 0))  # an empty payload is well formed
    w.load_payload(good)
    assert len(w) == 2


def test_load_payload_sizes_the_table_from_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    w = DedupWindow(1000)
    for i in range(5000):
        w.remember("x", f"m{i}", 100, 0)
    payloads = w.checkpoint_payloads(1000)
    fresh = DedupWindow(1000)
    fresh.load_payload(payloads[0])
    sized = fresh.slots()
    assert sized >= 2 * 5000
    for payload in payloads[1:]:
        fresh.load_payload(payload)
    assert fresh.slots() == sized  # no growth after the first payload
    assert fresh.digests() == w.digests()
    # a hint far beyond what a payload holds is bounded
    monkeypatch.setattr(dedup_module, "_REST_HINT_MAX", 10_000)
    lying = struct.pack("<II", 1, 2**32 - 1) + struct.pack("<QQ", 77, 100_000)
    fresh2 = DedupWindow(1000)
    for i in range(716):
        fresh2.remember_digest(1000 + i, 100, 0)
    assert fresh2.slots() == dedup_module._MIN_SLOTS  # 716 fit, one more does not
    fresh2.load_payload(lying)
    assert fresh2.slots() == 32_768  # sized for 716 + 10_000 entries, not 2**32
    assert len(fresh2) == 717


def test_load_entries_is_remember_in_order() -> None:
    """Recovery loads the ids of replayed publishes in one call; the result must be
    the same window as remembering them one by one (LSNs aside: replay has none)."""
    from array import array

    rng = random.Random(7)
    one, bulk = DedupWindow(60), DedupWindow(60)
    digests, walls = array("Q"), array("q")
    t = 1_700_000_000.0
    for _ in range(5000):
        t += rng.random() * 0.05
        mid = f"m{rng.randrange(3000)}"  # repeats: refreshed entries
        one.remember("x", mid, t, 0)
        digests.append(digest("x", mid))
        walls.append(round(t * 1000))
    bulk.load_entries(digests, walls)
    assert len(bulk) == len(one) and sorted(bulk.digests()) == sorted(one.digests())
    # times outside 0..2**44 ms are clamped, as remember() does
    clamped = DedupWindow(60)
    clamped.load_entries(array("Q", [digest("x", "a"), digest("x", "b")]), array("q", [-5, 1 << 50]))
    assert sorted(ms for _d, ms in clamped.digests()) == [0, (1 << 44) - 1]
    for probe in (t, t + 30, t + 59):
        for i in range(0, 3000, 7):
            assert bulk.lookup("x", f"m{i}", probe) == one.lookup("x", f"m{i}", probe)
