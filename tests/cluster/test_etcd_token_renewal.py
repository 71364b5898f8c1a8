"""etcd's users (broker/cluster/etcdaccess.py ``EtcdTokens``): many calls
waiting on one renewal that fails share its error at once, rather than each trying
again in turn (the last one waiting as many timeouts as there were callers); a caller
that comes after the failure tries again. Without a server, on trio's virtual clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from broker.cluster.etcdaccess import EtcdAuthFailed, EtcdCredentials, EtcdTokens
from broker.cluster.etcdproto import EtcdError, EtcdUnavailable

#: how long the fake etcd takes to fail an authentication (a timeout, say)
FAIL_AFTER_S = 5.0


@pytest.mark.parametrize(
    "failure",
    [
        EtcdUnavailable("etcd unreachable: http://127.0.0.1:1: no connection within 5 s"),
        EtcdError("etcd: etcdserver: authentication failed, invalid user ID or password", code=3),
    ],
    ids=["unavailable", "refused"],
)
async def test_callers_waiting_on_a_failed_renewal_share_its_error(autojump_clock: Any, failure: EtcdError) -> None:
    tokens = EtcdTokens(EtcdCredentials("ack", "pw"))
    asked = 0

    async def authenticate(body: dict[str, Any]) -> dict[str, Any]:
        nonlocal asked
        asked += 1
        await trio.sleep(FAIL_AFTER_S)
        raise failure

    errors: list[tuple[type[BaseException], float]] = []

    async def call() -> None:
        try:
            await tokens.current(authenticate)
        except EtcdUnavailable as exc:  # (EtcdAuthFailed is one too)
            errors.append((type(exc), trio.current_time()))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(call)
    expected = EtcdAuthFailed if not isinstance(failure, EtcdUnavailable) else EtcdUnavailable
    assert [t for t, _ in errors] == [expected] * 10
    assert asked == 1, "one authentication for the callers that waited on it"
    assert max(at for _, at in errors) - start == pytest.approx(FAIL_AFTER_S)
    # a caller after the failure tries again (etcd may be back)
    ok = False

    async def authenticate_ok(body: dict[str, Any]) -> dict[str, Any]:
        nonlocal ok
        ok = True
        return {"token": "t"}

    assert (await tokens.current(authenticate_ok)).value == "t" and ok


async def test_a_token_a_watch_was_refused_for_is_renewed_at_the_next_call_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whichever comes first after etcd forgot its tokens (a restart), a call refused
    for its token or the watch cancelled for it, the log says the token was renewed
    (once); the first authentication is no renewal."""
    tokens = EtcdTokens(EtcdCredentials("ack", "pw"))
    asked = 0

    async def authenticate(body: dict[str, Any]) -> dict[str, Any]:
        nonlocal asked
        asked += 1
        return {"token": f"t{asked}"}

    with caplog.at_level("INFO", logger="ackbus.cluster"):
        first = await tokens.current(authenticate)
        assert "etcd token renewed" not in caplog.text
        tokens.forget(first, "a watch cancelled for its token: invalid auth token")
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(tokens.current, authenticate)
    assert (await tokens.current(authenticate)).value == "t2" and asked == 2
    renewed = [r for r in caplog.records if r.getMessage() == "etcd token renewed"]
    assert len(renewed) == 1 and "invalid auth token" in str(renewed[0].__dict__.get("fields"))
