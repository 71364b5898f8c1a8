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
- Relative paths are relative to the working directory of the broker process, from
  every source (not to the config file), so that one rule covers them all.

The tables here are the single source of truth: ``--help`` and the configuration
reference in ``docs/operations.md`` are derived from them (a test checks the doc).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import pathlib
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, Literal, NoReturn, cast

from broker import __version__

__all__ = [
    "ConfigError",
    "ENV_PREFIX",
    "CONFIG_ENV",
    "GiB",
    "KiB",
    "LogFormat",
    "LogLevel",
    "MiB",
    "SettingInfo",
    "Settings",
    "build_arg_parser",
    "describe_settings",
    "format_size",
    "load_settings",
    "parse_size",
]

ENV_PREFIX: Final = "ACKBUS_"
CONFIG_ENV: Final = "ACKBUS_CONFIG"

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["human", "json"]


class ConfigError(Exception):
    """A setting is invalid, or a source of settings cannot be read.

    ``message`` is complete and meant for a person (the CLI prints it and exits 2);
    ``setting`` and ``source`` carry the same facts for code and tests, when known.
    """

    def __init__(self, message: str, *, setting: str | None = None, source: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.setting = setting
        self.source = source


class _Invalid(ValueError):
    """Internal: a value failed conversion or a check; the caller adds name and source."""


# --------------------------------------------------------------------------- kinds
#
# A kind converts a value from text (flags, environment) or from a Python value (TOML,
# direct construction of Settings) and renders a default for people.


class _Kind:
    metavar = "VALUE"
    type_name = "a value"

    def parse(self, text: str) -> Any:
        """Convert the text of a flag or environment variable; raise _Invalid."""
        raise NotImplementedError

    def coerce(self, value: object) -> Any:
        """Convert a TOML value or a constructor argument; raise _Invalid."""
        raise NotImplementedError

    def show(self, value: Any) -> str:
        return str(value)


class _Str(_Kind):
    metavar = "TEXT"
    type_name = "a string"

    def parse(self, text: str) -> Any:
        if not text:
            raise _Invalid("must not be empty")
        return text

    def coerce(self, value: object) -> Any:
        if not isinstance(value, str):
            raise _Invalid(f"must be {self.type_name}, not {_toml_type(value)}")
        return self.parse(value)


class _Choice(_Str):
    def __init__(self, *choices: str) -> None:
        self.choices = choices
        self.metavar = "{" + ",".join(choices) + "}"

    def parse(self, text: str) -> Any:
        lowered = text.strip().lower()
        if lowered not in self.choices:
            raise _Invalid(f"must be one of {', '.join(self.choices)}")
        return lowered


class _Fsync(_Str):
    metavar = "always|never|interval=MS"
    _INTERVAL = re.compile(r"interval=(\d+)")

    def parse(self, text: str) -> Any:
        lowered = text.strip().lower()
        if lowered in ("always", "never"):
            return lowered
        match = self._INTERVAL.fullmatch(lowered)
        if match is None or int(match.group(1)) < 1:
            raise _Invalid("must be always, never, or interval=<milliseconds> with milliseconds >= 1")
        return f"interval={int(match.group(1))}"


class _Path(_Kind):
    metavar = "PATH"
    type_name = "a path string"

    def parse(self, text: str) -> Any:
        if not text:
            raise _Invalid("must not be empty")
        return pathlib.Path(text)

    def show(self, value: Any) -> str:
        # Path("./data") prints as "data"; keep the "./" that makes it read as a path.
        text = str(value)
        return text if pathlib.PurePath(text).is_absolute() or text.startswith(".") else f"./{text}"

    def coerce(self, value: object) -> Any:
        if isinstance(value, pathlib.PurePath):
            value = str(value)
        if not isinstance(value, str):
            raise _Invalid(f"must be {self.type_name}, not {_toml_type(value)}")
        return self.parse(value)


class _OptionalPath(_Path):
    """A path where the empty string (or None, in Python) means "not set"."""

    def parse(self, text: str) -> Any:
        return pathlib.Path(text) if text else None

    def coerce(self, value: object) -> Any:
        return None if value is None else super().coerce(value)

    def show(self, value: Any) -> str:
        return "stderr" if value is None else super().show(value)


class _Int(_Kind):
    metavar = "N"
    type_name = "an integer"

    def parse(self, text: str) -> Any:
        try:
            return int(text.strip(), 10)
        except ValueError:
            raise _Invalid(f"must be {self.type_name}") from None

    def coerce(self, value: object) -> Any:
        # bool is a subclass of int in Python; `port = true` is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(f"must be {self.type_name}, not {_toml_type(value)}")
        return value


_SIZE_UNITS: Final[Mapping[str, int]] = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kib": KiB,
    "m": MiB,
    "mib": MiB,
    "g": GiB,
    "gib": GiB,
    "t": 1024 * GiB,
    "tib": 1024 * GiB,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
_SIZE_RE: Final = re.compile(r"\s*([+-]?\d[\d_]*)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """Parse a byte size such as ``65536``, ``16MiB``, ``64m`` or ``1MB``.

    ``k``/``m``/``g``/``t`` and ``KiB``/``MiB``/``GiB``/``TiB`` are powers of 1024;
    ``kB``/``MB``/``GB``/``TB`` are powers of 1000. Units are case-insensitive.
    Raises ValueError when the text is not a size. The sign is kept, so that the caller
    can say "must not be negative" rather than "not a size".
    """
    match = _SIZE_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    number, unit = match.groups()
    multiplier = _SIZE_UNITS.get(unit.lower())
    if multiplier is None:
        raise ValueError(f"unknown size unit {unit!r} in {text!r}")
    return int(number) * multiplier


def format_size(value: int) -> str:
    """Render a byte count with the largest binary unit that divides it: ``16MiB``."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


class _Size(_Int):
    metavar = "BYTES"
    type_name = "a size in bytes"

    def parse(self, text: str) -> Any:
        try:
            return parse_size(text)
        except ValueError:
            raise _Invalid(f"must be {self.type_name}, optionally with a unit such as KiB, MiB, GiB") from None

    def coerce(self, value: object) -> Any:
        if isinstance(value, str):
            return self.parse(value)
        return super().coerce(value)

    def show(self, value: Any) -> str:
        return format_size(cast(int, value))


class _Seconds(_Kind):
    metavar = "SECONDS"
    type_name = "a number of seconds"

    def parse(self, text: str) -> Any:
        try:
            value = float(text.strip())
        except ValueError:
            raise _Invalid(f"must be {self.type_name}") from None
        return self._finite(value)

    def coerce(self, value: object) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Invalid(f"must be {self.type_name}, not {_toml_type(value)}")
        return self._finite(float(value))

    @staticmethod
    def _finite(value: float) -> float:
        if not math.isfinite(value):
            raise _Invalid("must be a finite number")
        return value

    def show(self, value: Any) -> str:
        return f"{value:g}"


_TRUE: Final = frozenset({"true", "1", "yes"})
_FALSE: Final = frozenset({"false", "0", "no"})


class _Bool(_Kind):
    metavar = "BOOL"
    type_name = "a boolean"

    def parse(self, text: str) -> Any:
        lowered = text.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise _Invalid("must be one of true/false, 1/0, yes/no")

    def coerce(self, value: object) -> Any:
        if not isinstance(value, bool):
            raise _Invalid(f"must be {self.type_name}, not {_toml_type(value)}")
        return value

    def show(self, value: Any) -> str:
        return "true" if value else "false"


def _toml_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array", dict: "a table"}
    return names.get(type(value), type(value).__name__)


# --------------------------------------------------------------------------- checks

_Check = Callable[[Any], str | None]


def _at_least(low: float) -> _Check:
    def check(value: Any) -> str | None:
        if value < low:
            return "must not be negative" if low == 0 else f"must be at least {low:g}"
        return None

    return check


def _between(low: int, high: int) -> _Check:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"must be between {low} and {high}"

    return check


def _positive(value: Any) -> str | None:
    return None if value > 0 else "must be greater than 0"


_NON_NEGATIVE: Final = _at_least(0)


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


def _setting(default: Any, kind: _Kind, group: str, help: str, check: _Check | None = None) -> Any:
    info = SettingInfo("", default, group, help, kind, check)
    return dataclasses.field(default=default, metadata={"ackbus": info})


_STR = _Str()
_PATH = _Path()
_INT = _Int()
_SIZE = _Size()
_SECONDS = _Seconds()
_BOOL = _Bool()


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
    max_connections: int = _setting(
        10000, _INT, "network", "Open TCP connections beyond this are refused.", _at_least(1)
    )
    # HTTP limits. h11 buffers a whole request head before parsing it, so the header
    # limit also bounds memory per connection; the timeouts defend against slowloris.
    max_header_bytes: int = _setting(
        64 * KiB, _SIZE, "http", "Largest request line plus headers (431 beyond).", _at_least(1)
    )
    # 16 MiB is RabbitMQ 4's default max_message_size.
    max_body_bytes: int = _setting(
        16 * MiB, _SIZE, "http", "Largest message body or REST request body (413 beyond).", _NON_NEGATIVE
    )
    header_timeout_s: float = _setting(
        10.0, _SECONDS, "http", "Time allowed to receive a request's headers.", _positive
    )
    body_timeout_s: float = _setting(
        30.0, _SECONDS, "http", "Time allowed between two pieces of a REST request body.", _positive
    )
    idle_timeout_s: float = _setting(
        60.0, _SECONDS, "http", "A keep-alive connection with no request for this long is closed.", _positive
    )
    # entity limits; 2047 is RabbitMQ's default channel_max, rounded.
    max_channels: int = _setting(2048, _INT, "limits", "Open channels, broker-wide.", _at_least(1))
    max_queues: int = _setting(10000, _INT, "limits", "Declared queues.", _at_least(1))
    max_exchanges: int = _setting(10000, _INT, "limits", "Declared exchanges.", _at_least(1))
    # storage
    data_dir: pathlib.Path = _setting(
        pathlib.Path("data"), _PATH, "storage", "Directory of the WAL segments and checkpoints."
    )
    fsync: str = _setting(
        "always",
        _Fsync(),
        "storage",
        "When to fsync the WAL: always (before every confirm), never (leave it to the OS; "
        "a crash can lose confirmed messages), or interval=MS (at most MS ms of confirmed "
        "messages at risk).",
    )
    segment_max_bytes: int = _setting(
        64 * MiB, _SIZE, "storage", "A WAL segment is closed and a new one begun past this size.", _at_least(1)
    )
    checkpoint_interval_s: float = _setting(
        300.0, _SECONDS, "storage", "Write a checkpoint this often; 0 disables the timer.", _NON_NEGATIVE
    )
    checkpoint_wal_bytes: int = _setting(
        256 * MiB,
        _SIZE,
        "storage",
        "Write a checkpoint once the WAL grew by this much since the last one; 0 disables.",
        _NON_NEGATIVE,
    )
    queue_memory_messages: int = _setting(
        2048,
        _INT,
        "storage",
        "Ready messages a durable queue keeps in memory; the bodies of the rest of its "
        "backlog stay only in the WAL segments and are read back when their turn comes.",
        _at_least(1),
    )
    repair: bool = _setting(
        False,
        _BOOL,
        "storage",
        "Salvage a corrupt WAL at start: drop everything from the first corrupt record on. "
        "LOSES DATA, including confirmed messages; use only to get a broker back up.",
    )
    # messaging. Precedents: SQS (30 s default visibility timeout, 12 h maximum),
    # NATS JetStream (2 min duplicate window), RabbitMQ (30 min consumer_timeout).
    dedup_window_s: float = _setting(
        120.0, _SECONDS, "messaging", "A message_id seen this recently is acked but not enqueued again; 0 disables.",
        _NON_NEGATIVE,
    )
    default_lease_s: float = _setting(
        30.0, _SECONDS, "messaging", "Lease of a REST get when the request names none.", _positive
    )
    max_lease_s: float = _setting(43200.0, _SECONDS, "messaging", "Longest lease a client may ask for.", _positive)
    consumer_timeout_s: float = _setting(
        1800.0,
        _SECONDS,
        "messaging",
        "Ack timeout of a channel delivery when consume names no ack_timeout_ms: "
        "unacked this long, it returns to its queue.",
        _positive,
    )
    max_wait_s: float = _setting(
        60.0, _SECONDS, "messaging", "Longest long-poll wait of a REST get; longer requests are capped.",
        _NON_NEGATIVE,
    )
    # AMQP 0-9-1 basic.qos prefetch-count is a short: 65535 is the protocol's ceiling.
    max_prefetch: int = _setting(
        65535, _INT, "messaging", "Largest prefetch a consumer may ask for.", _between(1, 65535)
    )
    channel_buffer_bytes: int = _setting(
        1 * MiB,
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

    def __post_init__(self) -> None:
        values: dict[str, Any] = {}
        for info in _INFOS:
            raw = getattr(self, info.name)
            value = _validate(info, info.kind.coerce, raw, "Settings()")
            if value is not raw:
                object.__setattr__(self, info.name, value)
            values[info.name] = value
        _check_together(values, dict.fromkeys(values, "Settings()"))

    @property
    def fsync_interval_ms(self) -> int | None:
        """The ``interval=MS`` of :attr:`fsync` as an int, else None."""
        if self.fsync.startswith("interval="):
            return int(self.fsync.removeprefix("interval="))
        return None

    def as_dict(self) -> dict[str, str | int | float | bool | None]:
        """JSON-friendly view (paths as strings), for the start-up log line and /overview."""
        out: dict[str, str | int | float | bool | None] = {}
        for info in _INFOS:
            value = getattr(self, info.name)
            out[info.name] = str(value) if isinstance(value, pathlib.PurePath) else value
        return out


def _collect_infos() -> tuple[SettingInfo, ...]:
    infos = []
    for f in dataclasses.fields(Settings):
        info = f.metadata["ackbus"]
        infos.append(dataclasses.replace(info, name=f.name))
    return tuple(infos)


_INFOS: Final = _collect_infos()
_BY_NAME: Final = {info.name: info for info in _INFOS}


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
    """Rules that involve more than one setting."""
    if values["default_lease_s"] > values["max_lease_s"]:
        raise ConfigError(
            f"default_lease_s = {values['default_lease_s']:g} (from {sources['default_lease_s']}) "
            f"must not exceed max_lease_s = {values['max_lease_s']:g} (from {sources['max_lease_s']})",
            setting="default_lease_s",
            source=sources["default_lease_s"],
        )


class _ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error raises ConfigError instead of exiting by itself."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see --help)", source="command line")


_GROUP_TITLES: Final = {
    "network": "network",
    "http": "HTTP limits and timeouts",
    "limits": "entity limits",
    "storage": "storage (write-ahead log)",
    "messaging": "messaging",
    "logging": "logging",
}

_EPILOG: Final = f"""\
Every setting can also come from an environment variable {ENV_PREFIX}<NAME> or from a
TOML file (--config or {CONFIG_ENV}) whose keys are the setting names, such as
max_body_bytes = "16MiB". Precedence: flags > environment > config file > defaults.
Sizes accept units: k/KiB, m/MiB, g/GiB (x1024) and kB, MB, GB (x1000).
Durations are in seconds."""


def build_arg_parser(prog: str = "ackbus-broker") -> argparse.ArgumentParser:
    """The broker's command-line parser: ``--config``, ``--version`` and one flag per setting.

    Every setting flag has ``default=None`` (and booleans a ``--no-`` twin), so the
    loader can tell "not given" from "given"; the help text carries the real default
    and the environment variable. Usage errors raise :class:`ConfigError`.
    """
    parser = _ArgumentParser(
        prog=prog,
        description="ackbus: an AMQP-style message broker spoken over HTTP/1.1.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--config", metavar="PATH", default=None, help=f"TOML file of settings (env: {CONFIG_ENV})"
    )
    groups = {key: parser.add_argument_group(title) for key, title in _GROUP_TITLES.items()}
    for info in _INFOS:
        text = f"{info.help} (default: {info.show_default()}; env: {info.env})".replace("%", "%%")
        group = groups[info.group]
        if isinstance(info.kind, _Bool):
            group.add_argument(
                info.flag, dest=info.name, action=argparse.BooleanOptionalAction, default=None, help=text
            )
        else:
            group.add_argument(info.flag, dest=info.name, metavar=info.metavar, default=None, help=text)
    return parser


def load_settings(argv: Sequence[str] | None, environ: Mapping[str, str]) -> Settings:
    """Read settings from flags, environment and config file; validate; return them.

    ``argv`` excludes the program name (None: ``sys.argv[1:]``). ``environ`` is passed
    in, not read from ``os.environ``, so that tests need no monkeypatching; environment
    variables that start with ``ACKBUS_`` but name no setting are ignored (the client
    and the test fault points use that prefix too).

    Raises ConfigError for any invalid value, unreadable or malformed config file,
    unknown config key or usage error. ``--help`` and ``--version`` print and raise
    ``SystemExit(0)``, as argparse does.
    """
    args = build_arg_parser().parse_args(argv)

    values: dict[str, Any] = {info.name: info.default for info in _INFOS}
    sources: dict[str, str] = dict.fromkeys(values, "default")

    config_path: str | None = args.config
    config_source = "--config"
    if config_path is None and environ.get(CONFIG_ENV):
        config_path, config_source = environ[CONFIG_ENV], f"environment variable {CONFIG_ENV}"
    if config_path is not None:
        for info, raw, source in _read_toml(config_path, config_source):
            values[info.name] = _validate(info, info.kind.coerce, raw, source)
            sources[info.name] = source

    for info in _INFOS:
        text = environ.get(info.env)
        if text is not None:
            source = f"environment variable {info.env}"
            values[info.name] = _validate(info, info.kind.parse, text, source)
            sources[info.name] = source

    for info in _INFOS:
        given = getattr(args, info.name)
        if given is not None:
            parse = info.kind.coerce if isinstance(given, bool) else info.kind.parse
            values[info.name] = _validate(info, parse, given, info.flag)
            sources[info.name] = info.flag

    _check_together(values, sources)
    return Settings(**values)


def _read_toml(path: str, how: str) -> Iterator[tuple[SettingInfo, object, str]]:
    source = f"config file {path}"
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path} (from {how}): {exc.strerror or exc}", source=source) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}", source=source) from exc
    for key, raw in document.items():
        info = _BY_NAME.get(key)
        if info is None:
            hint = difflib.get_close_matches(key.replace("-", "_").lower(), _BY_NAME, n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(f"unknown setting {key!r} in {source}{suggestion}", setting=key, source=source)
        yield info, raw, source
