"""Broker settings: one frozen dataclass, four sources, one precedence order.

Every setting has a name (``max_body_bytes``), a type, a default, a command-line flag
(``--max-body-bytes``), an environment variable (``ACKBUS_MAX_BODY_BYTES``) and a TOML
key (``max_body_bytes``). :func:`load_settings` reads them with this precedence, highest
first:

1. command-line flags;
2. environment variables ``ACKBUS_<NAME>``;
3. the TOML file named by ``--config PATH`` or ``ACKBUS_CONFIG`` (flat, keys are the
   setting names; an unknown key is an error, so a typo cannot silently do nothing);
4. the defaults below.

Rules:

- Every value from every source is validated when it is read, even one a higher source
  overrides, so a broken config file is reported the day it is written and not the day
  someone removes the flag that hid it. A :class:`ConfigError` names the setting, the
  offending value and its source (``--port``, ``environment variable ACKBUS_PORT``,
  ``config file /etc/ackbus.toml``).
- Sizes accept a unit: ``16MiB``, ``64m``, ``512k`` (powers of 1024, as nginx and the
  JVM read them) or ``1MB`` / ``1kB`` (powers of 1000, SI). Durations are seconds
  (``_s`` names), fractions allowed. Negative sizes and durations are errors; so are
  NaN and infinity.
- Booleans from text accept ``true/false``, ``1/0``, ``yes/no`` (any case); in TOML they
  must be TOML booleans. Each boolean flag has a ``--no-`` twin so a flag can override
  an environment variable in both directions.
- The cluster's settings (every one of the cluster group but ``etcd``) mean something
  only with ``etcd``: given without it, from any source, they are refused, so that a
  forgotten ``--etcd`` cannot start a lone node its operator believes clustered.
- Relative paths are relative to the working directory of the broker process, from
  every source (not to the config file), so that one rule covers them all.

The tables here are the single source of truth: ``--help`` and the configuration
reference in ``docs/operations.md`` are derived from them (a test checks the doc).
The rules that involve more than one setting are :mod:`broker.config.rules`.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeVar

from broker.config.errors import ConfigError
from broker.config.kinds import (
    _BOOL,
    _INT,
    _NON_NEGATIVE,
    _OPTIONAL_STR,
    _PATH,
    _SECONDS,
    _SIZE,
    _STR,
    _WATERMARK,
    _at_least,
    _between,
    _Check,
    _Choice,
    _Fsync,
    _Invalid,
    _Kind,
    _OptionalPath,
    _positive,
)
from broker.config.rules import DEFAULT_SOURCE, check_together
from broker.http import Limits
from broker.runtime import RuntimeOptions
from broker.storage import parse_fsync_policy

__all__ = [
    "ConfigError",
    "ENV_PREFIX",
    "CONFIG_ENV",
    "LogFormat",
    "LogLevel",
    "SettingInfo",
    "Settings",
    "describe_settings",
]

ENV_PREFIX: Final = "ACKBUS_"
CONFIG_ENV: Final = "ACKBUS_CONFIG"


LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["human", "json"]


_Section = TypeVar("_Section")


@dataclasses.dataclass(frozen=True)
class SettingInfo:
    """What the loader, ``--help`` and the docs know about one setting."""

    name: str
    default: Any
    group: str
    help: str
    kind: _Kind
    check: _Check | None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def metavar(self) -> str:
        return self.kind.metavar

    def show_default(self) -> str:
        return self.kind.show(self.default)


def _default(layer: type, name: str) -> Any:
    """The default of ``name`` as the layer that uses it writes it (``CoreConfig``,
    ``RuntimeOptions``, the HTTP ``Limits``): defaults live there, once."""
    for f in dataclasses.fields(layer):
        if f.name == name:
            return f.default
    raise AssertionError(f"{layer.__name__} has no field {name!r}")  # pragma: no cover


def _setting(default: Any, kind: _Kind, group: str, help: str, check: _Check | None = None) -> Any:
    info = SettingInfo("", default, group, help, kind, check)
    return dataclasses.field(default=default, metadata={"ackbus": info})




# --------------------------------------------------------------------------- settings


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every broker setting, validated. Build one with :func:`load_settings`.

    Constructing it directly (tests do: ``Settings(port=0, data_dir=tmp_path)``) and
    ``dataclasses.replace`` validate too, and raise :class:`ConfigError`. Paths may be
    given as ``str``; they are stored as :class:`pathlib.Path`.
    """

    # network
    host: str = _setting("127.0.0.1", _STR, "network", "Address to listen on.")
    port: int = _setting(8080, _INT, "network", "TCP port to listen on; 0 picks a free port.", _between(0, 65535))
    amqp_port: int = _setting(
        5672, _INT, "network", "AMQP 0-9-1 port on host (docs/amqp.md); 0 turns the AMQP listener off.",
        _between(0, 65535),
    )
    amqps_port: int = _setting(
        5671, _INT, "network", "AMQP over TLS port, served only when tls_cert is set; 0 turns it off.",
        _between(0, 65535),
    )
    max_connections: int = _setting(
        _default(Limits, "max_connections"), _INT, "network", "Open TCP connections beyond this are refused.", _at_least(1)
    )
    max_connections_per_address: int = _setting(
        _default(Limits, "max_connections_per_address"), _INT, "network",
        "Open TCP connections from one client address beyond this are refused.", _at_least(1),
    )
    # TLS (docs/security.md): all three are re-read on SIGHUP.
    tls_cert: pathlib.Path | None = _setting(
        None, _OptionalPath("none"), "security", "PEM certificate chain: serve HTTPS (with tls_key); empty: plain HTTP."
    )
    tls_key: pathlib.Path | None = _setting(None, _OptionalPath("none"), "security", "PEM private key of tls_cert.")
    tls_client_ca: pathlib.Path | None = _setting(
        None, _OptionalPath("none"), "security", "PEM CA bundle: require client certificates signed by it (mutual TLS)."
    )
    max_connections_per_user: int = _setting(
        _default(RuntimeOptions, "max_connections_per_user"), _INT, "security",
        "Requests in progress (busy connections) per user.", _at_least(1),
    )
    max_channels_per_user: int = _setting(
        _default(RuntimeOptions, "max_channels_per_user"), _INT, "security", "Open channels per user.", _at_least(1)
    )
    max_consumers_per_user: int = _setting(
        _default(RuntimeOptions, "max_consumers_per_user"), _INT, "security",
        "Consumers (channel consumers and streaming consumes) per user.", _at_least(1),
    )
    auth_failure_limit: int = _setting(
        _default(RuntimeOptions, "auth_failure_limit"), _INT, "security",
        "Failed authentications from one address for one user name within auth_failure_window_s "
        "before further attempts with that name from there are answered 429 (ten times as many, "
        "all names together, before every new login from the address is).", _at_least(1),
    )
    auth_failure_window_s: float = _setting(
        _default(RuntimeOptions, "auth_failure_window_s"), _SECONDS, "security",
        "The window over which failed authentications are counted.", _positive,
    )
    # HTTP limits. h11 buffers a whole request head before parsing it, so the header
    # limit also bounds memory per connection; the timeouts defend against slowloris.
    max_header_bytes: int = _setting(
        _default(Limits, "max_header_bytes"), _SIZE, "http", "Largest request line plus headers (431 beyond).", _at_least(1)
    )
    # 16 MiB is RabbitMQ 4's default max_message_size.
    max_body_bytes: int = _setting(
        _default(RuntimeOptions, "max_body_bytes"), _SIZE, "http", "Largest message body or REST request body (413 beyond).", _NON_NEGATIVE
    )
    header_timeout_s: float = _setting(
        _default(Limits, "header_timeout_s"), _SECONDS, "http", "Time allowed to receive a request's headers.", _positive
    )
    body_timeout_s: float = _setting(
        _default(Limits, "body_timeout_s"), _SECONDS, "http", "Time allowed between two pieces of a REST request body.", _positive
    )
    idle_timeout_s: float = _setting(
        _default(Limits, "idle_timeout_s"), _SECONDS, "http", "A keep-alive connection with no request for this long is closed.", _positive
    )
    # entity limits; 2047 is RabbitMQ's default channel_max, rounded.
    max_channels: int = _setting(_default(RuntimeOptions, "max_channels"), _INT, "limits", "Open channels, broker-wide.", _at_least(1))
    max_queues: int = _setting(_default(RuntimeOptions, "max_queues"), _INT, "limits", "Declared queues.", _at_least(1))
    max_exchanges: int = _setting(_default(RuntimeOptions, "max_exchanges"), _INT, "limits", "Declared exchanges.", _at_least(1))
    memory_high_watermark: float = _setting(
        _default(RuntimeOptions, "memory_high_watermark"), _WATERMARK, "limits",
        "Memory alarm: above this resident size publishes wait, then are refused (503, a channel's nack) "
        "until it falls; a fraction (0.4, 40%) of the cgroup's or machine's memory, a size (1GiB), or 0: off.",
    )
    blocked_publish_wait_s: float = _setting(
        _default(RuntimeOptions, "blocked_publish_wait_s"), _SECONDS, "limits",
        "How long a publish waits while publishing is blocked (memory or disk alarm) before it is refused.",
        _NON_NEGATIVE,
    )
    # storage
    data_dir: pathlib.Path = _setting(
        pathlib.Path("data"), _PATH, "storage", "Directory of the WAL segments and checkpoints."
    )
    fsync: str = _setting(
        _default(RuntimeOptions, "fsync"),
        _Fsync(),
        "storage",
        "When to fsync the WAL: always (before every confirm), never (leave it to the OS; "
        "a crash can lose confirmed messages), or interval=MS (at most MS ms of confirmed "
        "messages at risk).",
    )
    segment_max_bytes: int = _setting(
        _default(RuntimeOptions, "segment_max_bytes"), _SIZE, "storage", "A WAL segment is closed and a new one begun past this size.", _at_least(1)
    )
    checkpoint_interval_s: float = _setting(
        _default(RuntimeOptions, "checkpoint_interval_s"), _SECONDS, "storage", "Write a checkpoint this often; 0 disables the timer.", _NON_NEGATIVE
    )
    checkpoint_wal_bytes: int = _setting(
        _default(RuntimeOptions, "checkpoint_wal_bytes"),
        _SIZE,
        "storage",
        "Write a checkpoint once the WAL grew by this much since the last one; 0 disables.",
        _NON_NEGATIVE,
    )
    reserve_bytes: int = _setting(
        _default(RuntimeOptions, "reserve_bytes"),
        _SIZE,
        "storage",
        "Disk space kept free in <data_dir>/reserve, released to write a checkpoint when the "
        "disk is full (the checkpoint frees the log); 0 disables.",
        _NON_NEGATIVE,
    )
    queue_memory_messages: int = _setting(
        _default(RuntimeOptions, "queue_memory_messages"),
        _INT,
        "storage",
        "Ready messages a durable queue keeps in memory; the bodies of the rest of its "
        "backlog stay only in the WAL segments and are read back when their turn comes.",
        _at_least(1),
    )
    repair: bool = _setting(
        _default(RuntimeOptions, "repair"),
        _BOOL,
        "storage",
        "Salvage a corrupt WAL at start: drop everything from the first corrupt record on. "
        "LOSES DATA, including confirmed messages; use only to get a broker back up.",
    )
    # messaging. Precedents: SQS (30 s default visibility timeout, 12 h maximum),
    # NATS JetStream (2 min duplicate window), RabbitMQ (30 min consumer_timeout).
    dedup_window_s: float = _setting(
        _default(RuntimeOptions, "dedup_window_s"), _SECONDS, "messaging", "A message_id seen this recently is acked but not enqueued again; 0 disables.",
        _NON_NEGATIVE,
    )
    default_lease_s: float = _setting(
        _default(RuntimeOptions, "default_lease_s"), _SECONDS, "messaging", "Lease of a REST get when the request names none.", _positive
    )
    max_lease_s: float = _setting(_default(RuntimeOptions, "max_lease_s"), _SECONDS, "messaging", "Longest lease a client may ask for.", _positive)
    auto_delete_grace_s: float = _setting(
        _default(RuntimeOptions, "auto_delete_grace_s"),
        _SECONDS,
        "messaging",
        "An auto-delete queue read with REST gets (no consumer) is deleted once it has had no get, "
        "no long-poll, no lease out and no message this long.",
        _NON_NEGATIVE,
    )
    consumer_timeout_s: float = _setting(
        _default(RuntimeOptions, "consumer_timeout_s"),
        _SECONDS,
        "messaging",
        "Ack timeout of a channel delivery when consume names no ack_timeout_ms: "
        "unacked this long, it returns to its queue.",
        _positive,
    )
    max_wait_s: float = _setting(
        _default(RuntimeOptions, "max_wait_s"), _SECONDS, "messaging", "Longest long-poll wait of a REST get; longer requests are capped.",
        _NON_NEGATIVE,
    )
    # AMQP 0-9-1 basic.qos prefetch-count is a short: 65535 is the protocol's ceiling.
    max_prefetch: int = _setting(
        _default(RuntimeOptions, "max_prefetch"), _INT, "messaging", "Largest prefetch a consumer may ask for.", _between(1, 65535)
    )
    channel_buffer_bytes: int = _setting(
        _default(RuntimeOptions, "channel_buffer_bytes"),
        _SIZE,
        "messaging",
        "High-water mark of a channel's outgoing buffer: deliveries pause above it.",
        _at_least(1),
    )
    shutdown_timeout_s: float = _setting(
        10.0, _SECONDS, "messaging", "On SIGTERM, how long to wait for in-flight work before closing.",
        _NON_NEGATIVE,
    )
    # logging
    log_level: LogLevel = _setting(
        "info", _Choice("debug", "info", "warning", "error"), "logging", "Least severe level written."
    )
    log_format: LogFormat = _setting(
        "human", _Choice("human", "json"), "logging", "human: one readable line; json: one JSON object per line."
    )
    log_file: pathlib.Path | None = _setting(
        None, _OptionalPath(), "logging", "Append logs to this file (reopened on SIGHUP); empty: stderr."
    )

    # cluster (docs/cluster.md): without etcd, none of this runs.
    etcd: str = _setting(
        "", _OPTIONAL_STR, "cluster",
        "etcd endpoints http://HOST:PORT[,...] or https://HOST:PORT[,...] (TLS): join a cluster; empty: a single node "
        "(the other cluster settings are then refused).",
    )
    etcd_ca_file: pathlib.Path | None = _setting(
        None, _OptionalPath("none"), "cluster",
        "CA bundle (PEM) that https etcd endpoints' certificates are verified with; empty: the system's CAs.",
    )
    etcd_cert: pathlib.Path | None = _setting(
        None, _OptionalPath("none"), "cluster",
        "PEM client certificate presented to https etcd endpoints (etcd's --client-cert-auth), with etcd_key.",
    )
    etcd_key: pathlib.Path | None = _setting(None, _OptionalPath("none"), "cluster", "PEM private key of etcd_cert.")
    etcd_user: str = _setting(
        "", _OPTIONAL_STR, "cluster",
        "etcd user (etcd's auth enabled) the node authenticates as, with etcd_password_file or ACKBUS_ETCD_PASSWORD.",
    )
    etcd_password: str = _setting(
        "", _OPTIONAL_STR, "cluster",
        "etcd_user's password; prefer the environment variable or etcd_password_file (a flag shows in ps).",
    )
    etcd_password_file: pathlib.Path | None = _setting(
        None, _OptionalPath("none"), "cluster", "File holding etcd_user's password (one line), read at start.",
    )
    node_name: str = _setting("", _OPTIONAL_STR, "cluster", "This node's name in the cluster, stable across restarts.")
    advertise_url: str = _setting("", _OPTIONAL_STR, "cluster", "The URL other nodes and clients reach this node at.")
    cluster_name: str = _setting("ackbus", _STR, "cluster", "Prefix of every etcd key of this cluster.")
    # 4 s: a dead leader's lease lapses in etcd within 4 s (its keepalive goes every
    # 4/3 s, one small request), so failover is about 3-5 s (docs/cluster.md); etcd's
    # own minimum lease TTL (1.5 election timeouts: 2 s by default) bounds it below.
    cluster_lease_ttl_s: int = _setting(
        4, _INT, "cluster", "TTL of a node's membership lease: a node silent this long is shown dead.", _between(2, 3600)
    )
    replica_compact_entries: int = _setting(
        10_000, _INT, "cluster",
        "A quorum queue's replica compacts its log once this many entries precede what every replica holds.",
        _between(10, 100_000_000),
    )
    cluster_secret: str = _setting(
        "", _OPTIONAL_STR, "cluster",
        "Shared by every node: authenticates the channels and requests nodes forward to one another.",
    )
    cluster_ca_file: pathlib.Path | None = _setting(
        None, _OptionalPath("none"), "cluster",
        "CA bundle (PEM) nodes verify one another's https certificates with; empty: the system's CAs.",
    )
    cluster_cert: pathlib.Path | None = _setting(
        None, _OptionalPath("none"), "cluster",
        "PEM client certificate a node presents when it calls another over https (mutual TLS between nodes), "
        "with cluster_key.",
    )
    cluster_key: pathlib.Path | None = _setting(None, _OptionalPath("none"), "cluster", "PEM private key of cluster_cert.")

    def __post_init__(self) -> None:
        values: dict[str, Any] = {}
        for info in _INFOS:
            raw = getattr(self, info.name)
            value = _validate(info, info.kind.coerce, raw, "Settings()")
            if value is not raw:
                object.__setattr__(self, info.name, value)
            values[info.name] = value
        # Direct construction has no sources: a value other than the default counts as given.
        sources = {
            info.name: DEFAULT_SOURCE if values[info.name] == info.default else "Settings()" for info in _INFOS
        }
        _check_together(values, sources)

    @property
    def fsync_interval_ms(self) -> int | None:
        """The ``interval=MS`` of :attr:`fsync` as an int, else None."""
        policy = parse_fsync_policy(self.fsync)
        return policy.interval_ms if policy.mode == "interval" else None

    def section(self, layer: type[_Section]) -> _Section:
        """The options of one layer (``RuntimeOptions``, ``Limits``...) built from the
        settings of the same names; the layer's other fields keep their defaults. So
        adding a setting touches its layer's options and this table, nothing else."""
        names = {f.name for f in dataclasses.fields(layer)}  # type: ignore[arg-type]
        return layer(**{info.name: getattr(self, info.name) for info in _INFOS if info.name in names})

    def as_dict(self) -> dict[str, str | int | float | bool | None]:
        """JSON-friendly view (paths as strings), for the start-up log line and /overview;
        a secret shows only whether it is set."""
        out: dict[str, str | int | float | bool | None] = {}
        for info in _INFOS:
            value = getattr(self, info.name)
            if info.name in SECRET_SETTINGS and value:
                value = "(set)"
            out[info.name] = str(value) if isinstance(value, pathlib.PurePath) else value
        return out


#: Settings whose value is never shown (logs, /overview): only whether they are set.
SECRET_SETTINGS: Final = frozenset({"cluster_secret", "etcd_password"})


def _collect_infos() -> tuple[SettingInfo, ...]:
    infos = []
    for f in dataclasses.fields(Settings):
        info = f.metadata["ackbus"]
        infos.append(dataclasses.replace(info, name=f.name))
    return tuple(infos)


_INFOS: Final = _collect_infos()
_BY_NAME: Final = {info.name: info for info in _INFOS}
#: The settings that mean something only in a cluster: refused without etcd.
_CLUSTER_ONLY: Final = tuple(info.name for info in _INFOS if info.group == "cluster" and info.name != "etcd")


def describe_settings() -> tuple[SettingInfo, ...]:
    """Every setting in declaration order: name, flag, env, default, group, help."""
    return _INFOS


# --------------------------------------------------------------------------- loading


def _validate(info: SettingInfo, convert: Callable[[Any], Any], raw: Any, source: str) -> Any:
    """Convert ``raw`` and check the result; raise ConfigError naming setting and source."""
    try:
        value = convert(raw)
        problem = info.check(value) if info.check is not None else None
    except _Invalid as exc:
        problem = str(exc)
    if problem is not None:
        raise ConfigError(f"{info.name} = {raw!r} from {source}: {problem}", setting=info.name, source=source)
    return value


def _check_together(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """The rules that involve more than one setting (:mod:`broker.config.rules`)."""
    check_together(values, sources, cluster_only=_CLUSTER_ONLY)
