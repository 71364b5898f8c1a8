"""A management request's JSON body, read as RabbitMQ reads it.

RabbitMQ's management API takes an object whose keys it knows and ignores any
other (``rabbitmqadmin`` and ops scripts send ``vhost``, ``name`` and the like with
a declare), and takes ``"true"`` and ``"false"`` for its booleans: so does this, unlike ackbus's own API, which refuses unknown fields to
catch typos. The keys it knows are read with the same typed accessors as ackbus's
own routes (:class:`~broker.api.fields.Fields`: the same checks, the same errors).
"""

from __future__ import annotations

from collections.abc import Set

import orjson

from broker.api.fields import Fields
from broker.core import InvalidArgument
from broker.http import Request

__all__ = ["BOOLEAN_KEYS", "known_fields", "require_keys"]


#: The body keys RabbitMQ reads as booleans: it takes ``"true"`` and ``"false"`` for
#: them too, and ``rabbitmqadmin`` sends them so (``durable=true`` on its command line).
BOOLEAN_KEYS = frozenset({"durable", "auto_delete", "exclusive", "internal"})


async def known_fields(request: Request, known: Set[str]) -> Fields:
    """The body's keys of ``known`` as :class:`Fields` (an empty body: none), the
    text ``"true"`` and ``"false"`` of :data:`BOOLEAN_KEYS` as booleans.

    Raises: ``InvalidArgument`` (``400 bad_request``: ``not_json``, as RabbitMQ
    says) for a body that is not a JSON object."""
    raw = await request.read_body()
    if not raw.strip():
        return Fields({}, known)
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidArgument("not_json") from None
    if not isinstance(obj, dict):
        raise InvalidArgument("not_json")
    kept = {key: value for key, value in obj.items() if key in known}
    for key in BOOLEAN_KEYS.intersection(kept):
        if kept[key] in ("true", "false"):
            kept[key] = kept[key] == "true"
    return Fields(kept, known)


def require_keys(fields: Fields, *names: str) -> None:
    """RabbitMQ's refusal of a body without a key it needs (``[{key_missing,NAME}]``)."""
    for name in names:
        if name not in fields.obj:
            raise InvalidArgument(f"[{{key_missing,{name}}}]")
