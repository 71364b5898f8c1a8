"""Record framing: encoder, sans-IO decoder, frame scanner."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.storage import (
    NEED_DATA,
    FrameProblem,
    ProblemKind,
    RecordDecoder,
    RecordTooLarge,
    encode_record,
    encode_records,
)
from broker.storage.framing import ScanGaveUp, find_valid_frame

records_strategy = st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=300)), max_size=30)


def decode_all(
    data: bytes, *, offset: int = 0
) -> tuple[list[tuple[int, bytes]], FrameProblem | None]:
    decoder = RecordDecoder(offset=offset)
    decoder.feed(data)
    decoder.feed_eof()
    records = list(decoder.iter_records())
    return records, decoder.problem


def test_frame_layout_is_length_crc_type_payload() -> None:
    frame = encode_record(7, b"hello")
    length, crc = struct.unpack_from("<II", frame)
    assert length == 6
    assert crc == zlib.crc32(b"\x07hello")
    assert frame[8:] == b"\x07hello"


def test_roundtrip_including_empty_payload() -> None:
    data = encode_record(0, b"") + encode_record(255, b"x" * 1000)
    assert decode_all(data) == ([(0, b""), (255, b"x" * 1000)], None)


@pytest.mark.parametrize("rtype", [-1, 256])
def test_record_type_out_of_range_is_rejected(rtype: int) -> None:
    with pytest.raises(ValueError, match="0..255"):
        encode_record(rtype, b"")
    with pytest.raises(ValueError, match="0..255"):
        encode_records([(1, b""), (rtype, b"")])


def test_record_over_max_size_is_rejected() -> None:
    encode_record(1, b"x" * 9, max_record_bytes=10)
    with pytest.raises(RecordTooLarge) as info:
        encode_record(1, b"x" * 10, max_record_bytes=10)
    assert isinstance(info.value, ValueError)
    with pytest.raises(RecordTooLarge):
        encode_records([(1, b"x" * 10)], max_record_bytes=10)


@settings(deadline=None)  # a loaded CI machine must not fail a pure test
@given(records_strategy)
def test_batch_encoder_equals_joined_single_frames(records: list[tuple[int, bytes]]) -> None:
    data, count = encode_records(records)
    assert count == len(records)
    assert data == b"".join(encode_record(t, p) for t, p in records)


@settings(deadline=None)  # a loaded CI machine must not fail a pure test
@given(records_strategy, st.lists(st.integers(0, 10_000), max_size=20))
def test_decoder_is_split_independent(records: list[tuple[int, bytes]], cuts: list[int]) -> None:
    data, _ = encode_records(records)
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    decoder = RecordDecoder()
    out: list[tuple[int, bytes]] = []
    for start, end in zip(points, points[1:]):
        decoder.feed(data[start:end])
        out.extend(decoder.iter_records())
    decoder.feed_eof()
    out.extend(decoder.iter_records())
    assert out == records
    assert decoder.problem is None
    assert decoder.offset == len(data)


def test_next_record_answers_need_data_until_a_frame_is_complete() -> None:
    frame = encode_record(3, b"abc")
    decoder = RecordDecoder()
    for byte in frame[:-1]:
        decoder.feed(bytes([byte]))
        assert decoder.next_record() is NEED_DATA
    decoder.feed(frame[-1:])
    assert decoder.next_record() == (3, b"abc")
    assert decoder.next_record() is NEED_DATA
    decoder.feed_eof()
    assert decoder.next_record() is NEED_DATA  # clean end
    assert decoder.problem is None


def test_zeroed_header_is_reported_with_offset() -> None:
    good = encode_record(1, b"a")
    records, problem = decode_all(good + bytes(64), offset=32)
    assert records == [(1, b"a")]
    assert problem is not None
    assert problem.kind is ProblemKind.ZEROED
    assert problem.offset == 32 + len(good)


def test_few_trailing_zero_bytes_are_zeroed_not_short() -> None:
    _, problem = decode_all(encode_record(1, b"a") + bytes(3))
    assert problem is not None and problem.kind is ProblemKind.ZEROED


def test_zero_length_with_nonzero_crc_is_bad_length() -> None:
    _, problem = decode_all(struct.pack("<II", 0, 1234) + b"junk")
    assert problem is not None and problem.kind is ProblemKind.BAD_LENGTH


def test_length_over_max_is_reported_before_waiting_for_the_body() -> None:
    decoder = RecordDecoder(max_record_bytes=1024)
    decoder.feed(struct.pack("<II", 0xFFFFFFF0, 0))  # only a header: no eof, no body
    answer = decoder.next_record()
    assert isinstance(answer, FrameProblem)
    assert answer.kind is ProblemKind.TOO_LARGE
    assert answer.offset == 0
    assert decoder.buffered == 8  # nothing was allocated for the claimed length


def test_crc_mismatch_is_reported_at_the_frame_start() -> None:
    first = encode_record(1, b"first")
    second = bytearray(encode_record(2, b"second"))
    second[-1] ^= 0x01
    records, problem = decode_all(first + bytes(second) + encode_record(3, b"third"))
    assert records == [(1, b"first")]
    assert problem is not None
    assert problem.kind is ProblemKind.CRC_MISMATCH
    assert problem.offset == len(first)
    assert "crc32" in str(problem)


@pytest.mark.parametrize("keep", [1, 4, 8, 9, 12])
def test_input_ending_inside_a_frame_is_short(keep: int) -> None:
    frame = encode_record(5, b"payload!")
    _, problem = decode_all(encode_record(1, b"") + frame[:keep])
    assert problem is not None
    assert problem.kind is ProblemKind.SHORT
    assert problem.offset == 9


def test_a_problem_is_sticky() -> None:
    decoder = RecordDecoder()
    decoder.feed(bytes(8))
    first = decoder.next_record()
    assert isinstance(first, FrameProblem)
    decoder.feed(encode_record(1, b"valid"))
    assert decoder.next_record() is first
    assert list(decoder.iter_records()) == []


def test_feeding_while_iterating_is_an_error() -> None:
    decoder = RecordDecoder()
    decoder.feed(encode_record(1, b"a") + encode_record(2, b"b"))
    iterator = decoder.iter_records()
    assert next(iterator) == (1, b"a")
    with pytest.raises(RuntimeError):
        decoder.feed(b"x")
    assert next(iterator) == (2, b"b")
    assert list(iterator) == []  # the generator is done
    decoder.feed(encode_record(3, b"c"))
    assert list(decoder.iter_records()) == [(3, b"c")]


def test_large_record_fed_in_small_chunks() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    frame = encode_record(9, payload)
    decoder = RecordDecoder()
    out: list[tuple[int, bytes]] = []
    for start in range(0, len(frame), 4096):
        decoder.feed(frame[start : start + 4096])
        out.extend(decoder.iter_records())
    assert out == [(9, payload)]


def test_find_valid_frame_skips_garbage_and_zeros() -> None:
    frame = encode_record(4, b"needle")
    garbage = b"\xff\x13garbage-without-frames" + bytes(100)
    assert find_valid_frame(garbage + frame) == len(garbage)
    assert find_valid_frame(garbage) is None
    assert find_valid_frame(bytes(10_000)) is None
    assert find_valid_frame(frame, 1) is None
    assert find_valid_frame(frame[:-1]) is None


@settings(deadline=None)  # a loaded CI machine must not fail a pure test
@given(st.binary(max_size=200), st.integers(0, 255), st.binary(max_size=50))
def test_find_valid_frame_finds_a_frame_after_any_junk(
    junk: bytes, rtype: int, payload: bytes
) -> None:
    frame = encode_record(rtype, payload)
    found = find_valid_frame(junk + frame)
    assert found is not None
    assert found <= len(junk)


def test_find_valid_frame_ignores_a_frame_followed_by_impossible_bytes() -> None:
    frame = encode_record(4, b"needle")
    impossible = struct.pack("<II", 0xFFFFFFFF, 0)
    assert find_valid_frame(frame + impossible) is None
    assert find_valid_frame(frame + bytes(8)) == 0  # zeros may follow
    assert find_valid_frame(frame + b"abc") == 0  # so may a torn header
    assert find_valid_frame(frame + encode_record(1, b"")) == 0


def test_find_valid_frame_gives_up_when_its_budget_is_spent() -> None:
    # Many plausible lengths, no valid frame: every candidate costs a checksum.
    data = bytes([1, 1, 0, 0]) * 5_000
    assert find_valid_frame(data, budget_bytes=10**12) is None
    with pytest.raises(ScanGaveUp):
        find_valid_frame(data, budget_bytes=1000)
