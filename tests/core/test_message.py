"""Message properties: validation (check_properties) and how a message keeps them."""

from __future__ import annotations

import pytest

from broker.core.errors import InvalidArgument
from broker.core.message import StoredMessage, check_properties


def test_string_properties_are_limited_to_255_utf8_bytes() -> None:
    assert check_properties({"message_id": "a" * 255}) == {"message_id": "a" * 255}
    with pytest.raises(InvalidArgument, match="message_id is longer than 255 bytes"):
        check_properties({"message_id": "a" * 256})
    # 128 characters, 256 bytes: the limit is on bytes, not characters
    assert check_properties({"type": "é" * 127}) == {"type": "é" * 127}
    with pytest.raises(InvalidArgument, match="type is longer than 255 bytes"):
        check_properties({"type": "é" * 128})


def test_text_that_is_not_unicode_is_refused() -> None:
    # JSON can carry a lone surrogate ("\ud800"); it cannot be stored as UTF-8
    with pytest.raises(InvalidArgument, match="message_id is not valid UTF-8 text"):
        check_properties({"message_id": "id-\ud800"})


def test_null_properties_are_dropped_and_empty_becomes_none() -> None:
    assert check_properties({"message_id": "m", "type": None}) == {"message_id": "m"}
    assert check_properties({"type": None}) is None
    assert check_properties({}) is None
    with pytest.raises(InvalidArgument, match="unknown property 'colour'"):
        check_properties({"colour": "red"})


def test_messages_share_their_other_properties_and_keep_their_own_id() -> None:
    a = StoredMessage(1, "", "q", b"", {"message_id": "a", "content_type": "text/plain", "delivery_mode": 2})
    b = StoredMessage(2, "", "q", b"", {"delivery_mode": 2, "message_id": "b", "content_type": "text/plain"})
    c = StoredMessage(3, "", "q", b"", {"content_type": "text/plain", "delivery_mode": 2, "message_id": "c"})
    assert (a.message_id, b.message_id, c.message_id) == ("a", "b", "c")
    assert a.properties == {"message_id": "a", "content_type": "text/plain", "delivery_mode": 2}
    assert a._props is c._props  # same items in the same order: one shared dict
    assert a._props == b._props and "message_id" not in a._props
    only_id = StoredMessage(4, "", "q", b"", {"message_id": "d"})
    assert only_id._props is None and only_id.properties == {"message_id": "d"}


def test_a_caller_dict_is_never_changed_and_an_owned_one_may_be() -> None:
    given = {"message_id": "x", "priority": 3}
    StoredMessage(1, "", "q", b"", given)
    assert given == {"message_id": "x", "priority": 3}
    # unhashable values (headers) are not shared: the message keeps its own copy
    with_headers = {"message_id": "y", "headers": {"k": [1, 2]}}
    m = StoredMessage(2, "", "q", b"", with_headers)
    assert with_headers["message_id"] == "y" and m._props == {"headers": {"k": [1, 2]}}
    owned = {"message_id": "z", "headers": {"k": [1]}}
    m = StoredMessage(3, "", "q", b"", owned, owned=True)
    assert m._props is owned and owned == {"headers": {"k": [1]}} and m.message_id == "z"
    assert m.persistent
    assert not StoredMessage(4, "", "q", b"", {"delivery_mode": 1, "message_id": "t"}).persistent
