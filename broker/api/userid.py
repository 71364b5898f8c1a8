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

__all__ = ["GUEST", "check_user_id", "publisher_name"]

#: The caller's name where no users exist (AMQP's login there too).
GUEST = "guest"


def publisher_name(access: Access) -> str:
    """The user a publish with ``access`` comes from (``guest``: no users exist)."""
    return access.username or GUEST


def check_user_id(user_id: object, access: Access) -> None:
    """Refuse a publish's ``user_id`` (None: not set) that is not the caller's user
    name. Raises InvalidArgument with RabbitMQ's text."""
    if user_id is None:
        return
    username = publisher_name(access)
    if user_id != username:
        raise InvalidArgument(f"user_id property set to '{user_id}' but authenticated user was '{username}'")
