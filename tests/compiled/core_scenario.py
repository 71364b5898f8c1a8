"""The core driven through a seeded mix of its per-message commands, as the runtime
drives it (commands, then ``take_effects``; records made durable in batches; time
moving), printing every effect and every answer as one line of text. The compiled
modules outside the core go along as the runtime uses them: every publish is tracked
in the runtime's confirm book (``broker/runtime/confirms.py``) and every ``Confirm``
settles it there, and at the end the log's records pass through the WAL's framing
(``broker/storage/framing.py``) and back, whole, in uneven pieces, torn and corrupted.

``python -m tests.compiled.core_scenario SEED COUNT`` runs it in whichever build of the
core is imported (interpreted, or compiled: see docs/benchmarks.md "The builds");
``tests/compiled/test_builds_agree.py`` runs it under both and requires the same output.
With ``--quiet`` it prints only a digest; with ``--measure`` nothing (the core alone,
for callgrind: docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import sys
from typing import Any

from broker.core import AppendRecords, Broker, Confirm, CoreConfig, ErrorReply
from broker.runtime.confirms import PendingConfirms
from broker.storage.framing import (
    NEED_DATA,
    RecordDecoder,
    encode_record,
    encode_records,
)


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _describe(value: Any) -> str:
    """A stable text form of an effect or an answer (objects by their fields)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(f"{f.name}={_describe(getattr(value, f.name))}" for f in dataclasses.fields(value))
        return f"{type(value).__name__}({fields})"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_describe(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_describe(k)}: {_describe(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (str, bytes, int, float, type(None), set, frozenset)):
        return repr(value)
    # another object (an entity, a stored message): its type and its public
    # attributes, as both builds declare them (slots, or a compiled class's attributes)
    kind = type(value)
    names: set[str] = set(getattr(kind, "__mypyc_attrs__", ()))
    for klass in kind.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.update((slots,) if isinstance(slots, str) else slots)
    public = sorted(n for n in names if not n.startswith("_") and n != "__dict__")
    if isinstance(getattr(value, "name", None), str):
        return f"{kind.__name__}(name={value.name!r})"  # an entity: its name says which
    return f"{kind.__name__}(" + ", ".join(f"{n}={_describe(getattr(value, n, None))}" for n in public) + ")"


def run(seed: int, count: int, out: Any) -> None:
    """``count`` rounds of publishes, deliveries and settles on a few queues (``out``
    None: nothing is described, to measure the core alone)."""
    rng = random.Random(seed)

    def say(value: Any) -> None:
        if out is not None:
            out(_describe(value))

    mono, wall = _Clock(1000.0), _Clock(1_700_000_000.0)
    log: dict[int, tuple[int, bytes]] = {}

    def read_log(lsns: Any) -> list[tuple[int, bytes] | str]:
        return [log.get(lsn, f"record {lsn} is not in the log") for lsn in lsns]

    core = Broker(
        clock=mono, wall_clock=wall, boot_id="b0", read_log=read_log,
        config=CoreConfig(queue_memory_messages=64),
    )

    def step() -> None:
        for effect in core.take_effects():
            if isinstance(effect, AppendRecords):
                for i, record in enumerate(effect.records):
                    log[effect.first_lsn + i] = record
            say(effect)

    def call(name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            answer = getattr(core, name)(*args, **kwargs)
        except ErrorReply as exc:
            if out is not None:
                out(f"{name} -> {type(exc).__name__}({exc.code}: {exc})")
            return None
        if out is not None:
            out(f"{name} -> {_describe(answer)}")
        return answer

    book = PendingConfirms()
    publisher, consumer = core.open_channel(), core.open_channel()
    call("declare_queue", "durable-q")
    call("declare_queue", "transient-q", durable=False)
    call("declare_queue", "limited", arguments={"x-max-length": 50, "x-dead-letter-exchange": ""})
    call("declare_exchange", "fan", "fanout")
    call("bind", "fan", "durable-q")
    call("bind", "fan", "limited")
    call("consume", consumer, "durable-q", consumer_tag="c1", prefetch=20)
    step()
    unacked: list[int] = []
    for i in range(count):
        kind = rng.random()
        if kind < 0.55:
            exchange, key = rng.choice([("", "durable-q"), ("", "transient-q"), ("fan", ""), ("", "nowhere")])
            props: dict[str, Any] = {"delivery_mode": 2, "message_id": f"m-{rng.randrange(count)}"}
            if rng.random() < 0.1:
                props["priority"] = rng.randrange(10)
            body = b"x" * rng.randrange(1, 200)
            answer = call("publish", publisher, exchange, key, body, props, mandatory=rng.random() < 0.2)
            if answer is not None and out is not None:  # (--measure: the core alone)
                book.track(publisher, answer[0], len(body))
        elif kind < 0.8 and unacked:
            tag = unacked.pop(rng.randrange(len(unacked)))
            choice = rng.random()
            if choice < 0.8:
                call("ack", consumer, tag)
            elif choice < 0.9:
                call("nack", consumer, tag, False, rng.random() < 0.5)
            else:
                call("ack", consumer, tag + 1000)  # unknown: an error, changes nothing
        elif kind < 0.9:
            core.durable(core.last_lsn)
        else:
            mono.now += 0.5
            wall.now += 0.5
            core.advance()
        for effect in core.take_effects():
            if isinstance(effect, AppendRecords):
                for j, record in enumerate(effect.records):
                    log[effect.first_lsn + j] = record
            elif type(effect).__name__ == "Deliver" and effect.channel_id == consumer:
                unacked.append(effect.delivery_tag)
                core.grant_credit(consumer, 1 << 20)
            elif isinstance(effect, Confirm) and out is not None:
                book.confirmed(effect)
                say(f"unconfirmed bytes {book.unconfirmed_bytes(publisher)}")
            say(effect)
    core.durable(core.last_lsn)
    step()
    say(core.views.queue_info("durable-q"))
    if out is not None:
        _frame_and_read_back([log[lsn] for lsn in sorted(log)], rng, say)


def _frame_and_read_back(records: list[tuple[int, bytes]], rng: random.Random, say: Any) -> None:
    """The records through the WAL's framing and back: whole, fed in uneven pieces,
    with the last frame torn, and with one byte flipped."""
    frames, count = encode_records(records)
    say(f"framed {count} records: {len(frames)} bytes, sha256 {hashlib.sha256(frames).hexdigest()}")
    assert frames.startswith(encode_record(*records[0]))
    for label, data in (
        ("whole", frames),
        ("torn", frames[: len(frames) - 3]),
        ("flipped", _flip(frames, rng.randrange(len(frames)))),
    ):
        decoder = RecordDecoder()
        got: list[tuple[int, bytes]] = []
        pos = 0
        while pos < len(data):
            piece = rng.randrange(1, 4096)
            decoder.feed(data[pos : pos + piece])
            pos += piece
            got.extend((rtype, bytes(payload)) for rtype, payload in decoder.iter_records())
        decoder.feed_eof()
        answer = decoder.next_record()
        say(f"{label}: {len(got)} records back, same as written: {got == records[: len(got)]}, "
            f"then {'NEED_DATA (clean end)' if answer is NEED_DATA else answer}")


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes((data[at] ^ 0x55,)) + data[at + 1 :]


def main() -> None:
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    if "--measure" in sys.argv:
        run(seed, count, None)
    elif "--quiet" in sys.argv:
        digest = hashlib.sha256()
        run(seed, count, lambda line: digest.update(line.encode()))
        print(digest.hexdigest())
    else:
        run(seed, count, print)


if __name__ == "__main__":
    main()
