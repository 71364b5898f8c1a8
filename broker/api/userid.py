"""The validated user id: a message's ``user_id`` property, when set, names the user
who published it (RabbitMQ's "validated user-id"), so a consumer can trust it.

Every front end applies the same rule (docs/security.md, "Validated user id"): AMQP
(``broker/amqp/properties.py``), RabbitMQ's management API
(``broker/api/management/messages.py``), REST and the HTTP channel (this module).
The caller's name is the user it authenticated as (for an API token, the token's
user); where no users exist (an open loopback broker) it is ``guest``, as AMQP's
login there. Only a publish that sets ``user_id`` pays for the check.
"""

from __future__ import annotations

from broker.api.permissions import Access
from broker.core import InvalidArgument

__all__ = ["GUEST", "check_user_id", "publisher_name", "user_id_refusal"]

#: The caller's name where no users exist (AMQP's login there too).
GUEST = "guest"


def publisher_name(access: Access) -> str:
    """The user a publish with ``access`` comes from (``guest``: no users exist)."""
    return access.username or GUEST


def user_id_refusal(user_id: object, username: str | None) -> str | None:
    """RabbitMQ's reason for refusing a publish's ``user_id`` (None: not set) from
    ``username`` (None: no users exist, ``guest``), or None when it may pass. Each
    front end raises it as its own error (AMQP 406, /api/ 400, REST and channels
    ``invalid_argument``)."""
    name = username or GUEST
    if user_id is None or user_id == name:
        return None
    return f"user_id property set to '{user_id}' but authenticated user was '{name}'"


def check_user_id(user_id: object, access: Access) -> None:
    """Refuse a publish's ``user_id`` (None: not set) that is not the caller's user
    name. Raises InvalidArgument with RabbitMQ's text."""
    refusal = user_id_refusal(user_id, access.username)
    if refusal is not None:
        raise InvalidArgument(refusal)
