"""Broker settings: one table of every setting, read from flags, environment and a
TOML file (see :mod:`broker.config.settings`)."""

from broker.config.kinds import GiB, KiB, MiB, format_size, parse_size
from broker.config.loader import build_arg_parser, load_settings
from broker.config.settings import (
    CONFIG_ENV,
    ENV_PREFIX,
    ConfigError,
    LogFormat,
    LogLevel,
    SettingInfo,
    Settings,
    describe_settings,
)

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
