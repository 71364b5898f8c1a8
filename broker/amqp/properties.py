"""What a received publish's properties mean, as RabbitMQ reads them: ``expiration``
a string of milliseconds (``406`` otherwise), a ``delivery_mode`` other than 1 or 2
dropped, ``user_id`` that must be the connection's user (``406``), and direct
reply-to's ``reply_to`` (``replyto.py``) turned into the channel's reply address;
then the core's checks (``check_properties``).

Called for every publish with properties (the per-message path): a few dict lookups,
no copy (the decoder's dict is the publish's own).
"""

from __future__ import annotations

from typing import Any

from broker.amqp.replyto import REPLY_TO, reply_address_for
from broker.api import user_id_refusal
from broker.core import PreconditionFailed, check_properties

__all__ = ["received_properties"]


def received_properties(props: dict[str, Any], s: Any, ch: Any) -> dict[str, Any] | None:
    """``props`` of a publish on channel ``ch`` of session ``s`` (``session.py``'s,
    typed ``Any``: it imports this module), checked and converted in place."""
    if props.get("reply_to") == REPLY_TO:  # direct reply-to: the channel's own address
        props["reply_to"] = reply_address_for(s, ch)
    expiration = props.get("expiration")
    if expiration is not None:
        if not (expiration.isascii() and expiration.isdigit()):
            raise PreconditionFailed(f"PRECONDITION_FAILED - invalid expiration '{expiration}': no_integer")
        props["expiration"] = int(expiration)
    mode = props.get("delivery_mode")
    if mode is not None and mode not in (1, 2):
        del props["delivery_mode"]
    forged = user_id_refusal(props.get("user_id"), None if s.principal is None else s.principal.username)
    if forged is not None:
        raise PreconditionFailed(f"PRECONDITION_FAILED - {forged}")
    return check_properties(props)
