"""The user store: commands validate before they change anything, every change is one
record, and replay (twice, or after a snapshot) rebuilds the same users and tokens."""

from __future__ import annotations

from typing import Any

import pytest

from broker.core import InvalidArgument, NotFound
from broker.core.records import RecordType

from .durable_view import fresh_broker, replay_into, restart_from_log
from .helpers import Harness

ALL = {"configure": ".*", "write": ".*", "read": ".*"}


def users_view(b: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return (
        {name: (u.password, u.tags, u.permissions) for name, u in b.users.users.items()},
        {tid: t.record() for tid, t in b.users.tokens.items()},
    )


def populated() -> Harness:
    h = Harness()
    b = h.b
    assert b.put_user("alice", password="$scrypt$a", tags=["administrator"], permissions=ALL) is True
    assert b.put_user("bob", password="$scrypt$b", permissions={"read": "^jobs$"}) is True
    b.add_token("00000000000000aa", "bob", "d1", expires_s=None, description="ci")
    b.add_token("00000000000000bb", "alice", "d2", expires_s=h.wall.now + 60)
    assert b.put_user("bob", password=None, tags=["monitoring"], permissions={"read": ".*"}, keep_password=True) is False
    b.revoke_token("00000000000000bb")
    h.sync()
    return h


def test_each_change_is_one_record_and_replay_rebuilds_the_store() -> None:
    h = populated()
    types = [rtype for _lsn, rtype, _payload in h.records]
    assert types == [RecordType.USER, RecordType.USER, RecordType.TOKEN, RecordType.TOKEN, RecordType.USER, RecordType.TOKEN_DELETE]
    bob = h.b.users.get("bob")
    assert bob is not None and bob.password == "$scrypt$b" and bob.tags == ("monitoring",)
    for twice in (False, True):
        nb = replay_into(fresh_broker(h), h.records, h.records[-1][0], twice=twice)
        assert users_view(nb) == users_view(h.b)


def test_a_snapshot_carries_users_and_live_tokens_only() -> None:
    h = populated()
    h.b.add_token("00000000000000cc", "alice", "d3", expires_s=h.wall.now + 10)
    h.sync()
    h.wall.now += 11  # that token has expired by the checkpoint
    covered, chunks = h.b.snapshot()
    records = [(0, rtype, payload) for chunk in chunks for rtype, payload in chunk]
    nb = replay_into(fresh_broker(h), records, covered)
    users, tokens = users_view(nb)
    assert users == users_view(h.b)[0]
    assert set(tokens) == {"00000000000000aa"}


def test_deleting_a_user_deletes_its_tokens_durably() -> None:
    h = populated()
    h.b.delete_user("bob")
    h.sync()
    assert h.b.users.get("bob") is None and not h.b.users.tokens
    nb = restart_from_log(h)
    assert nb.users.get("bob") is None and not nb.users.tokens
    with pytest.raises(NotFound):
        h.b.delete_user("bob")


@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.put_user("", password="x"),
        lambda b: b.put_user("a:b", password="x"),
        lambda b: b.put_user("ctl\x01", password="x"),
        lambda b: b.put_user("x" * 256, password="x"),
        lambda b: b.put_user("carol", password="x", tags=["Admin"]),
        lambda b: b.put_user("carol", password="x", permissions={"read": "("}),
        lambda b: b.put_user("carol", password="x", permissions={"delete": ".*"}),
        lambda b: b.put_user("carol", password="x", permissions={"read": 3}),
        lambda b: b.add_token("zz", "alice", "d", expires_s=None),
        lambda b: b.add_token("00000000000000aa", "alice", "d", expires_s=None),  # id in use
        lambda b: b.add_token("00000000000000dd", "alice", "d", expires_s=1.0),  # in the past
        lambda b: b.add_token("00000000000000dd", "alice", "d", expires_s=None, description="x" * 300),
    ],
)
def test_invalid_commands_change_nothing(call: Any) -> None:
    h = populated()
    before = (users_view(h.b), h.b.users.generation, len(h.records))
    with pytest.raises(InvalidArgument):
        call(h.b)
    h.sync()
    assert (users_view(h.b), h.b.users.generation, len(h.records)) == before


def test_unknown_users_and_tokens_are_not_found() -> None:
    h = populated()
    with pytest.raises(NotFound):
        h.b.add_token("00000000000000dd", "nobody", "d", expires_s=None)
    with pytest.raises(NotFound):
        h.b.set_permissions("nobody", ALL)
    with pytest.raises(NotFound):
        h.b.revoke_token("00000000000000ff")


def test_permissions_are_unanchored_regexes_and_empty_means_nothing() -> None:
    h = Harness()
    h.b.put_user("u", password="x", permissions={"configure": "", "write": "^logs\\.", "read": "jobs"})
    user = h.b.users.get("u")
    assert user is not None
    assert user.allows("write", "logs.app") and not user.allows("write", "app.logs")
    assert user.allows("read", "jobs") and user.allows("read", "old-jobs-2")  # re.search, as RabbitMQ
    assert not user.allows("configure", "") and not user.allows("configure", "anything")


def test_a_malformed_user_record_is_a_replay_error() -> None:
    h = Harness()
    nb = fresh_broker(h)
    nb.begin_recovery()
    with pytest.raises(ValueError):
        nb.replay(RecordType.USER, b'{"name": "x"}', 1)
