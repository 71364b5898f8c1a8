"""The AMQP connection's frame reading (``broker/amqp/hotpath.py``, compiled, with the
interpreted ``connection.py`` around it) driven with seeded byte streams: publishes of
every shape, acks, other methods and heartbeats on two channels, whole and with bytes
broken at random places, received at once and in uneven reads; every event, the
output and the final state printed as one line each.

``python -m tests.compiled.amqp_scenario SEED COUNT`` runs it in whichever build is
imported; ``tests/compiled/test_builds_agree.py`` runs it under both and requires the
same output.
"""

from __future__ import annotations

import hashlib
import random
import sys
from typing import Any

from broker.amqp.connection import AMQPConnection, TuneLimits
from tests.amqp.test_connection import events, opened
from tests.amqp.test_hotpath import _stream


def _line(event: Any) -> str:
    method = getattr(event, "method", None)
    if method is not None and not hasattr(method, "__dataclass_fields__"):
        return f"Method({event.channel}, {event.index}, {type(method).__name__}, {sorted(vars(method).items())})"
    return repr(event)


def run(seed: int, count: int, out: Any) -> None:
    rng = random.Random(seed)
    for case in range(count):
        data = bytearray(_stream(rng))
        if case % 2:
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        limits = TuneLimits(max_body_bytes=rng.choice((200, 128 << 20)))
        conn: AMQPConnection = opened(limits, frame_max=4096)
        pos = 0
        while pos < len(data):
            size = rng.choice((len(data), rng.randrange(1, 3000)))
            conn.receive_data(bytes(data[pos : pos + size]))
            pos += size
            for event in events(conn):
                out.write(f"{case} {_line(event)}\n")
        output = conn.data_to_send()
        out.write(f"{case} out {len(output)} {hashlib.sha256(output).hexdigest()[:16]} {conn.state.value} "
                  f"{sorted(conn.channels)}\n")


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), sys.stdout)
