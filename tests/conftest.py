"""Fixtures every layer's tests may use (the support code itself is in tests/support).

``broker_app``
    The in-process broker (:func:`tests.support.app.open_broker_app`), memory-only,
    serving real HTTP on an ephemeral loopback port; its core is
    ``broker_app.runtime.core``.
``broker_limits`` / ``broker_options``
    The ``Limits`` and ``RuntimeOptions`` it is built with; override either fixture in
    a test module to change a setting for every test there.
``app``
    ``broker_app`` (a module may override it, e.g. with a fake log).
``client`` / ``memory_client``
    An HTTP client of it over TCP, or over in-process memory streams (for
    ``autojump_clock``).
``clients``
    Channel and stream clients connected to ``app``.
``seeded_random``
    A ``random.Random`` seeded from ``ACKBUS_TEST_SEED`` (or a fresh seed), printed so a
    failure can be replayed.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import AsyncIterator

import pytest

from broker.app import BrokerApp
from broker.http import Limits
from broker.runtime import RuntimeOptions
from tests.support.app import open_broker_app
from tests.support.channel import Clients
from tests.support.http import HTTPClient, open_memory_client, open_tcp_client
from tests.support.seeds import test_seed

#: Folders whose every test is ``slow`` (left out by ``scripts/test --fast``).
SLOW_FOLDERS = ("ui",)  # a real browser against a broker subprocess

#: The modules holding the suite's longest tests, longest first (seconds of one test
#: on the 2-core machine; ``scripts/test --durations=80`` finds them). They run first:
#: the xdist workers take tests in collection order, and a 90 s test started last
#: leaves one worker running it alone while the other has finished. Being first also
#: keeps a module on one worker (work stealing takes from the end of a worker's
#: list), so that its module-scoped server is started once.
LONG_MODULES = (
    # the differential modules, one after another: they share a worker's RabbitMQ
    # (~5-9 s to start) and ackbus broker (tests/system/conftest.py)
    "tests/system/test_amqp_differential.py",
    "tests/system/test_amqp_differential_more.py",
    "tests/system/test_amqp_differential_ccbcc.py",
    "tests/system/test_amqp_reply_to_differential.py",
    "tests/chaos/test_chaos.py",  # ~80 s: one minute of faults
    "tests/bench/test_bench_cluster_quorum.py",  # ~45 s: a 3-node cluster, 3 failovers, a 3-node RabbitMQ
    "tests/system/test_management_differential.py",  # ~30 s: its own RabbitMQ with the management plugin
    "tests/bench/test_bench_cluster.py",  # ~16 s: a cluster run against Redis
    "tests/cluster/test_replication.py",  # 5-16 s each: leases lapsing, failovers
    "tests/system/test_celery_amqp.py",  # ~14 s: a Celery worker across a broker kill
    "tests/system/test_coordination_crash.py",  # ~12 s each: a schedule ticking across kill -9
    "tests/system/test_crash_recovery.py",  # ~11 s: a publish storm under kill -9
    "tests/system/test_celery.py",  # ~11 s: a Celery worker across a broker kill
    "tests/cluster/test_cluster_schedules.py",  # ~10 s: a schedule through its runner's death
    "tests/system/test_celery_docs.py",  # ~10 s
    "tests/system/test_paging.py",  # ~10 s: kill -9 with a paged backlog
    "tests/cluster/test_forget.py",  # ~9 s
    "tests/bench/test_bench_smoke.py",  # ~8 s: the benchmark's quick run
    "tests/client/test_client_system.py",  # a real broker per test, restarts, the CLI (up to ~6 s)
    "tests/bench/test_bench_growth.py",  # ~5 s
    "tests/system/test_full_disk.py",
    "tests/system/test_security.py",
)


def _mark_slow_by_rule(item: pytest.Item) -> None:
    """``slow`` for the tests of :data:`SLOW_FOLDERS`, and for the asyncio runs of the
    client tests marked ``real_time`` (their crashes and reconnects wait in real time;
    their trio runs, on the virtual clock, stay in the fast lane)."""
    parts = item.path.relative_to(item.config.rootpath).parts
    if len(parts) > 1 and parts[0] == "tests" and parts[1] in SLOW_FOLDERS:
        item.add_marker(pytest.mark.slow)
        return
    callspec = getattr(item, "callspec", None)
    if (
        callspec is not None
        and callspec.params.get("anyio_backend") == "asyncio"
        and item.get_closest_marker("real_time") is not None
    ):
        item.add_marker(pytest.mark.slow)


def _long_modules_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the tests of :data:`LONG_MODULES` first, in that
    order; every module keeps its tests together and in their order, the rest keep
    theirs (a stable sort)."""
    rank = {module: i for i, module in enumerate(LONG_MODULES)}
    last = len(LONG_MODULES)

    def key(item: pytest.Item) -> int:
        return rank.get(item.path.relative_to(config.rootpath).as_posix(), last)

    items.sort(key=key)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-trio's trio mode, except for the tests marked ``anyio`` (the client's,
    run under trio and asyncio by anyio's plugin): every other async test runs under
    trio. Marks ``slow`` by rule (:func:`_mark_slow_by_rule`). Puts the modules of
    :data:`LONG_MODULES` first (:func:`_long_modules_first`)."""
    _long_modules_first(config, items)
    for item in items:
        _mark_slow_by_rule(item)
        if not isinstance(item, pytest.Function) or item.get_closest_marker("anyio") is not None:
            continue
        hypothesis = getattr(item.obj, "hypothesis", None)
        test_func = hypothesis.inner_test if hypothesis is not None else item.obj
        if inspect.iscoroutinefunction(test_func):
            item.add_marker(pytest.mark.trio)


@pytest.fixture
def broker_limits() -> Limits:
    # Short lingering close: error tests close connections and should not wait 2 s.
    return Limits(linger_s=0.2)


@pytest.fixture
def broker_options() -> RuntimeOptions:
    return RuntimeOptions(data_dir=None)


@pytest.fixture
async def broker_app(broker_limits: Limits, broker_options: RuntimeOptions) -> AsyncIterator[BrokerApp]:
    async with open_broker_app(broker_limits, broker_options) as app:
        yield app


@pytest.fixture
def app(broker_app: BrokerApp) -> BrokerApp:
    """The in-memory broker on loopback TCP (a module may override it, e.g. with a WAL)."""
    return broker_app


@pytest.fixture
async def clients(app: BrokerApp) -> AsyncIterator[Clients]:
    """Channel clients (tests/support/channel.py) connected to ``app``."""
    async with Clients(app.port) as c:
        yield c


@pytest.fixture
async def client(broker_app: BrokerApp) -> AsyncIterator[HTTPClient]:
    async with open_tcp_client(broker_app.port) as c:
        yield c


@pytest.fixture
async def memory_client(broker_app: BrokerApp) -> AsyncIterator[HTTPClient]:
    async with open_memory_client(broker_app) as c:
        yield c


@pytest.fixture
def seeded_random(request: pytest.FixtureRequest) -> random.Random:
    seed = test_seed(request.node.nodeid)
    return random.Random(seed)
