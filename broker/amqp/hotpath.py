"""The per-message frames read in one pass over the received bytes.

A pipelining publisher sends ``basic.publish`` + content header + body triples back to
back, and a consumer sends ``basic.ack`` after ``basic.ack``; a received chunk holds
hundreds of them. the :class:`HotReader` reads every such frame at the front of the buffer
straight into the events the frame-by-frame path (``connection.py``) would make,
without the per-frame tuples, payload copies and dispatch of that path; single acks
in a row on one channel become one :class:`~broker.amqp.events.Acks` event.

It takes only what it can take whole and unquestioned: a complete triple (method,
header and body in one frame each) or an ack, on a channel that is open with no
publish being assembled, every frame within ``frame_max`` and ending in ``0xce``, a
body within ``max_body``. At the first frame that is anything else (another method, a
heartbeat, a body split over frames, an unfinished triple, a frame that breaks a rule)
it stops and the frame-by-frame path takes over from there, so every error, and every
frame it does not know, is handled where it always was.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any

from broker.amqp.events import Acks, Content, Method
from broker.amqp.frames import ACK, PUBLISH, Ack, Publish, decode_properties

__all__ = ["HotReader"]

_CHANNEL_SIZE = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_CONTENT_HEAD = struct.Struct(">HHQH")
#: Publish methods seen, by their payload (a publisher repeats one exchange and key).
_PUBLISH_CACHE_MAX = 256


class HotReader:
    """One connection's reader of hot frames, with its cache of decoded publish methods."""

    __slots__ = ("_publishes",)

    def __init__(self) -> None:
        self._publishes: dict[bytes, Publish] = {}

    def scan(
        self, buf: bytearray, pos: int, frame_max: int, max_body: int, ready: set[int], events: deque[Any],
    ) -> int:
        """Append to ``events`` the events of the hot frames at ``buf[pos:]`` on the
        channels in ``ready`` (open, nothing being assembled); return the position of
        the first frame left for the frame-by-frame path."""
        publishes = self._publishes
        n = len(buf)
        append = events.append
        acks: Acks | None = None  # the run of single acks being added to
        while n - pos >= 8 and buf[pos] == 1:
            channel, size = _CHANNEL_SIZE.unpack_from(buf, pos + 1)
            end = pos + 7 + size
            if size + 8 > frame_max or end >= n or buf[end] != 0xCE or size < 4 or channel not in ready:
                break
            index = _U32.unpack_from(buf, pos + 7)[0]
            if index == ACK:
                if size != 13:
                    break
                tag = _U64.unpack_from(buf, pos + 11)[0]
                if buf[pos + 19] & 1:
                    append(Method(channel, ACK, Ack(tag, True)))
                    acks = None
                elif acks is not None and acks.channel == channel:
                    acks.tags.append(tag)
                else:
                    acks = Acks(channel, [tag])
                    append(acks)
                pos = end + 1
                continue
            acks = None
            if index != PUBLISH:
                break
            raw = bytes(buf[pos + 11 : end])
            publish = publishes.get(raw)
            if publish is None:
                publish = _publish_of(raw)
                if publish is None:
                    break
                if len(publishes) >= _PUBLISH_CACHE_MAX:
                    publishes.clear()
                publishes[raw] = publish
            # the content header
            h = end + 1
            if n - h < 8 or buf[h] != 2:
                break
            h_channel, h_size = _CHANNEL_SIZE.unpack_from(buf, h + 1)
            h_end = h + 7 + h_size
            if h_channel != channel or h_size < 14 or h_size + 8 > frame_max or h_end >= n or buf[h_end] != 0xCE:
                break
            class_id, _weight, body_size, flags = _CONTENT_HEAD.unpack_from(buf, h + 7)
            if class_id != 60 or body_size > max_body:
                break
            properties: dict[str, Any] | None
            if flags == 0x1000 and h_size == 15:
                properties = {"delivery_mode": buf[h + 21]}
            elif flags == 0:
                properties = None
            else:
                try:
                    properties = decode_properties(flags, bytes(buf[h + 7 : h_end]), 14)
                except Exception:
                    break  # the frame-by-frame path says what is wrong with it
            if body_size == 0:
                append(Content(channel, publish, properties, b""))
                pos = h_end + 1
                continue
            # the body, in one frame
            b = h_end + 1
            if n - b < 8 or buf[b] != 3:
                break
            b_channel, b_size = _CHANNEL_SIZE.unpack_from(buf, b + 1)
            b_end = b + 7 + b_size
            if b_channel != channel or b_size != body_size or b_size + 8 > frame_max or b_end >= n or buf[b_end] != 0xCE:
                break
            append(Content(channel, publish, properties, bytes(buf[b + 7 : b_end])))
            pos = b_end + 1
        return pos


def _publish_of(raw: bytes) -> Publish | None:
    """A ``basic.publish``'s arguments (ticket, exchange, routing key, bits), or None
    if they do not parse (then the frame-by-frame path raises the error)."""
    size = len(raw)
    if size < 5:
        return None
    end = 3 + raw[2]
    if end >= size:
        return None
    exchange = raw[3:end].decode("utf-8", "surrogateescape")
    start = end + 1
    end = start + raw[end]
    if end >= size:
        return None
    routing_key = raw[start:end].decode("utf-8", "surrogateescape")
    bits = raw[end]
    return Publish(exchange, routing_key, bool(bits & 1), bool(bits & 2))
