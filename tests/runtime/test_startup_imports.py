"""A broker loads the AMQP listener only with an AMQP port, and cluster mode only with
``--etcd`` (broker/app.py, ``broker.cluster``'s lazy face): every broker process pays
its imports in start CPU, and the suite starts hundreds of them.

Each test runs a fresh interpreter (``python -c``), since this process has long
imported everything. The single-node one serves a real broker (``build_app`` from
settings, as ``python -m broker`` does) and uses what must work without the lazy
packages (REST, ``GET /cluster``, the channels' list, an HTTP channel's direct
reply-to) before it looks at ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: What a single node may load of ``broker.cluster``: the face, the reasons the API
#: names (``reasons.py``) and the peer channel module (``peers.py``, with its HTTP read
#: loop), which the channels' relayed consumers name at import. Anything more is
#: cluster mode's (etcd, the mirror, replication: ~50 modules) leaking into every start.
SINGLE_NODE_CLUSTER_MODULES = {"broker.cluster", "broker.cluster.reasons", "broker.cluster.peers", "broker.cluster.h11io"}

SERVE_A_SINGLE_NODE = r"""
import json, sys
import trio
import broker.__main__  # what `python -m broker` imports before it builds the broker
from broker.app import build_app
from broker.config import load_settings
from tests.support.channel import Clients

REPLY_TO = "amq.rabbitmq.reply-to"

async def main(data_dir):
    settings = load_settings(["--host", "127.0.0.1", "--port", "0", "--amqp-port", "0", "--data-dir", data_dir], {})
    app = build_app(settings)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(app.serve, "127.0.0.1", 0)
            await app.runtime.ready_event.wait()
            async with Clients(app.port) as clients:
                for method, target, body, want in [
                    ("GET", "/healthz", None, 200),
                    ("GET", "/cluster", None, 200),
                    ("PUT", "/queues/q", {}, 201),
                    ("POST", "/exchanges/amq.default/publish", {"routing_key": "q", "body": "m"}, 200),
                    ("POST", "/queues/q/get", None, 200),
                    ("GET", "/channels", None, 200),
                ]:
                    status, answer = await clients.rest(method, target, body)
                    assert status == want, (method, target, status, answer)
                requester = await clients.channel()
                await requester.ok({"op": "consume", "queue": REPLY_TO, "consumer_tag": "r", "no_ack": True})
                await requester.ok({"op": "declare_queue", "queue": "rpc"})
                await requester.send({"op": "publish", "routing_key": "rpc", "body": "question",
                                      "properties": {"reply_to": REPLY_TO}})
                got = await requester.ok({"op": "get", "queue": "rpc", "no_ack": True})
                responder = await clients.channel()
                await responder.send({"op": "publish", "routing_key": got["message"]["properties"]["reply_to"],
                                      "body": "answer"})
                delivered = (await requester.events_until(lambda event: event["ev"] == "deliver"))[-1]
                assert delivered["message"]["body"] == "answer", delivered
            await app.shutdown(5)
    print(json.dumps(sorted(name for name in sys.modules if name.startswith("broker"))))

trio.run(main, sys.argv[1])
"""


def loaded_modules(script: str, *args: str) -> set[str]:
    """The ``broker`` modules a fresh interpreter holds after ``script`` (which prints
    them as a JSON list on its last line)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_a_single_node_without_amqp_loads_neither_the_amqp_listener_nor_cluster_mode(tmp_path: Path) -> None:
    loaded = loaded_modules(SERVE_A_SINGLE_NODE, str(tmp_path / "data"))
    assert "broker.app" in loaded and "broker.api" in loaded  # it did build and serve
    assert sorted(name for name in loaded if name.startswith("broker.amqp")) == []
    assert {name for name in loaded if name.startswith("broker.cluster")} <= SINGLE_NODE_CLUSTER_MODULES


@pytest.mark.parametrize(
    ("argv", "not_loaded"),
    [
        (["--help"], ("broker.app", "broker.api", "broker.amqp", "broker.cluster")),
        (["--version"], ("broker.app", "broker.api", "broker.amqp", "broker.cluster")),
        (["users", "--help"], ("broker.app", "broker.amqp")),
    ],
)
def test_the_command_line_without_a_broker_to_serve_loads_no_listener(argv: list[str], not_loaded: tuple[str, ...]) -> None:
    script = (
        "import json, sys\n"
        "from broker.__main__ import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
        "print(json.dumps(sorted(name for name in sys.modules if name.startswith('broker'))))\n"
    )
    loaded = loaded_modules(script)
    assert "broker.config" in loaded or argv[0] == "users"
    for package in not_loaded:
        assert sorted(name for name in loaded if name == package or name.startswith(package + ".")) == [], package


def test_the_cluster_face_gives_every_name_from_its_module() -> None:
    """``broker.cluster``'s names, resolved on first use, are the objects of the
    modules that define them; an unknown name is an AttributeError (ImportError for
    ``from ... import``), and ``dir()`` lists them all."""
    script = (
        "import importlib, json, sys\n"
        "import broker.cluster as face\n"
        "before = sorted(name for name in sys.modules if name.startswith('broker.cluster'))\n"
        "checks = {'ClusterNode': 'node', 'PeerStream': 'peers', 'is_moved': 'reasons', 'NO_QUORUM': 'reasons',\n"
        "          'EtcdUnavailable': 'etcdproto', 'StaleEpoch': 'replica_leader', 'parse_endpoints': 'etcd'}\n"
        "same = {name: getattr(face, name) is getattr(importlib.import_module('broker.cluster.' + module), name)\n"
        "        for name, module in checks.items()}\n"
        "every = all(getattr(face, name) is not None for name in face.__all__)\n"
        "missing = []\n"
        "try:\n"
        "    face.NoSuchName\n"
        "except AttributeError:\n"
        "    missing.append('attribute')\n"
        "try:\n"
        "    from broker.cluster import NoSuchName\n"
        "except ImportError:\n"
        "    missing.append('import')\n"
        "print(json.dumps([before, same, every, missing, sorted(set(face.__all__) - set(dir(face)))]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    before, same, every, missing, not_listed = json.loads(done.stdout.splitlines()[-1])
    assert before == ["broker.cluster"]  # the face alone loads nothing
    assert same == dict.fromkeys(same, True)
    assert every
    assert missing == ["attribute", "import"]
    assert not_listed == []
