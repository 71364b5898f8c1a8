"""Review of etcd's users (broker/cluster/etcdaccess.py ``EtcdTokens``): many calls
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
