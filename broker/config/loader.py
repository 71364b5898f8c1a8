"""Loading settings: command-line flags over environment variables over a TOML file
over the defaults, every value from every source validated as it is read."""

from __future__ import annotations

import argparse
import difflib
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, NoReturn

from broker import __version__
from broker.config.kinds import _Bool
from broker.config.rules import DEFAULT_SOURCE
from broker.config.settings import (
    _BY_NAME,
    _INFOS,
    CONFIG_ENV,
    ENV_PREFIX,
    ConfigError,
    SettingInfo,
    Settings,
    _check_together,
    _validate,
)
from broker.runtime import build_name

__all__ = ["build_arg_parser", "load_settings"]


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
    "security": "security (users, TLS, abuse limits)",
    "logging": "logging",
    "cluster": "cluster (etcd; docs/cluster.md)",
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
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__} ({build_name()} build)")
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
    sources: dict[str, str] = dict.fromkeys(values, DEFAULT_SOURCE)

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
