"""Settings: defaults, the precedence of sources, validation messages, --help, the doc."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.config import (
    ConfigError,
    GiB,
    KiB,
    MiB,
    Settings,
    build_arg_parser,
    describe_settings,
    format_size,
    load_settings,
    parse_size,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent

EXPECTED_DEFAULTS: dict[str, Any] = {
    "host": "127.0.0.1",
    "port": 8080,
    "amqp_port": 5672,
    "amqps_port": 5671,
    "data_dir": pathlib.Path("./data"),
    "max_body_bytes": 16 * MiB,
    "max_header_bytes": 65536,
    "header_timeout_s": 10.0,
    "idle_timeout_s": 60.0,
    "body_timeout_s": 30.0,
    "max_connections": 10000,
    "max_channels": 2048,
    "max_queues": 10000,
    "max_exchanges": 10000,
    "memory_high_watermark": 0.4,
    "blocked_publish_wait_s": 5.0,
    "fsync": "always",
    "segment_max_bytes": 64 * MiB,
    "checkpoint_interval_s": 300.0,
    "checkpoint_wal_bytes": 256 * MiB,
    "reserve_bytes": 8 * MiB,
    "queue_memory_messages": 2048,
    "repair": False,
    "dedup_window_s": 120.0,
    "default_lease_s": 30.0,
    "max_lease_s": 43200.0,
    "auto_delete_grace_s": 5.0,
    "consumer_timeout_s": 1800.0,
    "max_wait_s": 60.0,
    "channel_buffer_bytes": 1 * MiB,
    "max_prefetch": 65535,
    "shutdown_timeout_s": 10.0,
    "log_level": "info",
    "log_format": "human",
    "log_file": None,
    "etcd": "",
    "etcd_ca_file": None,
    "etcd_cert": None,
    "etcd_key": None,
    "etcd_user": "",
    "etcd_password": "",
    "etcd_password_file": None,
    "node_name": "",
    "advertise_url": "",
    "cluster_name": "ackbus",
    "cluster_lease_ttl_s": 4,
    "replica_compact_entries": 10_000,
    "cluster_secret": "",
    "cluster_ca_file": None,
    "cluster_cert": None,
    "cluster_key": None,
    "max_connections_per_address": 1000,
    "tls_cert": None,
    "tls_key": None,
    "tls_client_ca": None,
    "max_connections_per_user": 1000,
    "max_channels_per_user": 500,
    "max_consumers_per_user": 2000,
    "auth_failure_limit": 10,
    "auth_failure_window_s": 60.0,
}


def write_toml(tmp_path: pathlib.Path, text: str) -> str:
    path = tmp_path / "ackbus.toml"
    path.write_text(text)
    return str(path)


def test_defaults_are_the_documented_ones() -> None:
    settings = load_settings([], {})
    assert dataclasses.asdict(settings) == EXPECTED_DEFAULTS
    assert settings == Settings()
    assert {info.name for info in describe_settings()} == set(EXPECTED_DEFAULTS)


def test_every_setting_has_flag_env_and_toml_key() -> None:
    for info in describe_settings():
        assert info.flag == "--" + info.name.replace("_", "-")
        assert info.env == "ACKBUS_" + info.name.upper()


@pytest.mark.parametrize(
    ("name", "flag", "env", "toml"),
    [
        ("port", "1001", "1002", "1003"),
        ("host", "flag.example", "env.example", '"toml.example"'),
        ("header_timeout_s", "1.5", "2.5", "3.5"),
        ("max_body_bytes", "1000", "2k", '"3MiB"'),
        ("fsync", "never", "interval=5", '"interval=7"'),
        ("log_level", "debug", "warning", '"error"'),
        ("repair", "--repair", "yes", "false"),
    ],
)
def test_precedence_flag_over_env_over_file_over_default(
    tmp_path: pathlib.Path, name: str, flag: str, env: str, toml: str
) -> None:
    info = next(i for i in describe_settings() if i.name == name)
    flag_args = [flag] if flag.startswith("--") else [info.flag, flag]
    config = ["--config", write_toml(tmp_path, f"{name} = {toml}\n")]
    environ = {info.env: env}

    def value(argv: list[str], environ: dict[str, str]) -> Any:
        return getattr(load_settings(argv, environ), name)

    from_flag = value(flag_args, {})
    from_env = value([], environ)
    from_file = value(config, {})
    if name != "repair":  # a boolean has two values, not four
        assert len({from_flag, from_env, from_file, info.default}) == 4

    assert value([*config, *flag_args], environ) == from_flag
    assert value(config, environ) == from_env
    assert value(config, {}) == from_file
    assert value([], {}) == info.default


def test_precedence_concrete_values(tmp_path: pathlib.Path) -> None:
    config = write_toml(tmp_path, "port = 3\nhost = '0.0.0.0'\nmax_queues = 7\n")
    settings = load_settings(["--config", config, "--port", "1"], {"ACKBUS_PORT": "2", "ACKBUS_HOST": "::1"})
    assert (settings.port, settings.host, settings.max_queues, settings.max_channels) == (1, "::1", 7, 2048)


def test_config_file_from_environment_and_flag_wins(tmp_path: pathlib.Path) -> None:
    from_env = tmp_path / "env.toml"
    from_env.write_text("port = 11\n")
    from_flag = tmp_path / "flag.toml"
    from_flag.write_text("port = 22\n")
    assert load_settings([], {"ACKBUS_CONFIG": str(from_env)}).port == 11
    assert load_settings(["--config", str(from_flag)], {"ACKBUS_CONFIG": str(from_env)}).port == 22
    assert load_settings([], {"ACKBUS_CONFIG": ""}).port == 8080


def test_toml_types(tmp_path: pathlib.Path) -> None:
    config = write_toml(
        tmp_path,
        """
        max_body_bytes = "1MiB"
        segment_max_bytes = 4096
        header_timeout_s = 5          # an integer is fine for seconds
        repair = true
        data_dir = "/var/lib/ackbus"
        log_file = "/var/log/ackbus.log"
        log_level = "DEBUG"
        """,
    )
    settings = load_settings(["--config", config], {})
    assert settings.max_body_bytes == MiB
    assert settings.segment_max_bytes == 4096
    assert settings.header_timeout_s == 5.0 and isinstance(settings.header_timeout_s, float)
    assert settings.repair is True
    assert settings.data_dir == pathlib.Path("/var/lib/ackbus")
    assert settings.log_file == pathlib.Path("/var/log/ackbus.log")
    assert settings.log_level == "debug"


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("port = true", "must be an integer, not a boolean"),
        ('port = "8080"', "must be an integer, not a string"),
        ("port = 1.5", "must be an integer, not a number"),
        ("repair = 1", "must be a boolean, not an integer"),
        ('header_timeout_s = "10"', "must be a number of seconds, not a string"),
        ("host = 5", "must be a string, not an integer"),
        ("max_queues = [1]", "must be an integer, not an array"),
        ("[network]\nport = 1", "unknown setting 'network'"),
    ],
)
def test_toml_wrong_types_are_errors(tmp_path: pathlib.Path, line: str, fragment: str) -> None:
    config = write_toml(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as info:
        load_settings(["--config", config], {})
    assert fragment in info.value.message
    assert config in info.value.message


def test_unknown_toml_key_is_an_error_with_a_suggestion(tmp_path: pathlib.Path) -> None:
    config = write_toml(tmp_path, "max-body-bytes = 10\n")
    with pytest.raises(ConfigError, match="unknown setting 'max-body-bytes'.*did you mean 'max_body_bytes'"):
        load_settings(["--config", config], {})


def test_unreadable_or_malformed_config_file(tmp_path: pathlib.Path) -> None:
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match=r"cannot read config file .*nope\.toml \(from --config\)"):
        load_settings(["--config", missing], {})
    with pytest.raises(ConfigError, match="from environment variable ACKBUS_CONFIG"):
        load_settings([], {"ACKBUS_CONFIG": missing})
    bad = write_toml(tmp_path, "port = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(["--config", bad], {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("false", False), ("0", False), ("No", False)],
)
def test_boolean_environment_values(text: str, expected: bool) -> None:
    assert load_settings([], {"ACKBUS_REPAIR": text}).repair is expected


def test_boolean_flags_override_environment_both_ways() -> None:
    assert load_settings(["--no-repair"], {"ACKBUS_REPAIR": "yes"}).repair is False
    assert load_settings(["--repair"], {"ACKBUS_REPAIR": "no"}).repair is True
    with pytest.raises(ConfigError, match="repair = 'maybe' from environment variable ACKBUS_REPAIR"):
        load_settings([], {"ACKBUS_REPAIR": "maybe"})


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--port", "65536", "must be between 0 and 65535"),
        ("--port", "-1", "must be between 0 and 65535"),
        ("--port", "http", "must be an integer"),
        ("--max-body-bytes", "-1", "must not be negative"),
        ("--max-body-bytes", "-1MiB", "must not be negative"),
        ("--max-body-bytes", "12 parsecs", "must be a size in bytes"),
        ("--segment-max-bytes", "0", "must be at least 1"),
        ("--header-timeout-s", "-0.5", "must be greater than 0"),
        ("--header-timeout-s", "0", "must be greater than 0"),
        ("--idle-timeout-s", "nan", "must be a finite number"),
        ("--body-timeout-s", "inf", "must be a finite number"),
        ("--shutdown-timeout-s", "-1", "must not be negative"),
        ("--dedup-window-s", "soon", "must be a number of seconds"),
        ("--max-prefetch", "65536", "must be between 1 and 65535"),
        ("--max-connections", "0", "must be at least 1"),
        ("--fsync", "sometimes", "must be always, never, or interval="),
        ("--fsync", "interval=0", "milliseconds >= 1"),
        ("--log-level", "verbose", "must be one of debug, info, warning, error"),
        ("--log-format", "xml", "must be one of human, json"),
        ("--host", "", "must not be empty"),
        ("--data-dir", "", "must not be empty"),
    ],
)
def test_invalid_values_name_setting_value_and_source(flag: str, value: str, fragment: str) -> None:
    name = flag[2:].replace("-", "_")
    env = "ACKBUS_" + name.upper()
    with pytest.raises(ConfigError) as from_flag:
        load_settings([f"{flag}={value}"], {})  # "=": argparse takes "-1MiB" for an option
    assert from_flag.value.message.startswith(f"{name} = {value!r} from {flag}: ")
    assert fragment in from_flag.value.message
    assert (from_flag.value.setting, from_flag.value.source) == (name, flag)

    with pytest.raises(ConfigError) as from_env:
        load_settings([], {env: value})
    assert f"from environment variable {env}: " in from_env.value.message
    assert fragment in from_env.value.message


def test_every_source_is_validated_even_when_overridden(tmp_path: pathlib.Path) -> None:
    config = write_toml(tmp_path, "port = 70000\n")
    with pytest.raises(ConfigError, match=r"port = 70000 from config file .*: must be between"):
        load_settings(["--config", config, "--port", "1"], {})
    with pytest.raises(ConfigError, match="ACKBUS_PORT"):
        load_settings(["--port", "1"], {"ACKBUS_PORT": "-3"})


def test_negative_values_from_toml_are_errors(tmp_path: pathlib.Path) -> None:
    for line in ("max_header_bytes = -1", "consumer_timeout_s = -1.0", 'channel_buffer_bytes = "-1k"'):
        config = write_toml(tmp_path, line + "\n")
        with pytest.raises(ConfigError, match="config file"):
            load_settings(["--config", config], {})


def test_cross_setting_rule_names_both_sources() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(["--default-lease-s", "100"], {"ACKBUS_MAX_LEASE_S": "50"})
    message = info.value.message
    assert "default_lease_s = 100 (from --default-lease-s)" in message
    assert "max_lease_s = 50 (from environment variable ACKBUS_MAX_LEASE_S)" in message


def test_fsync_forms() -> None:
    assert load_settings(["--fsync", "Never"], {}).fsync == "never"
    settings = load_settings(["--fsync", "interval=0050"], {})
    assert settings.fsync == "interval=50"
    assert settings.fsync_interval_ms == 50
    assert Settings().fsync_interval_ms is None


def test_log_file_empty_means_stderr() -> None:
    assert load_settings([], {"ACKBUS_LOG_FILE": ""}).log_file is None
    assert load_settings(["--log-file", "x.log"], {}).log_file == pathlib.Path("x.log")


def test_unrelated_ackbus_environment_variables_are_ignored() -> None:
    assert load_settings([], {"ACKBUS_URL": "http://x", "ACKBUS_FAULT": "wal.before_fsync"}) == Settings()


def test_usage_errors_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="unrecognized arguments: --prot"):
        load_settings(["--prot", "1"], {})
    with pytest.raises(ConfigError, match="expected one argument"):
        load_settings(["--port"], {})
    with pytest.raises(ConfigError, match="unrecognized arguments"):
        load_settings(["serve"], {})
    # No abbreviations: --max-b could mean two settings tomorrow.
    with pytest.raises(ConfigError):
        load_settings(["--max-body", "1"], {})


def test_argv_none_reads_sys_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["ackbus-broker", "--port", "4242"])
    assert load_settings(None, {}).port == 4242


def test_help_lists_every_flag_with_default_and_env(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load_settings(["--help"], {})
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--config PATH" in text and "ACKBUS_CONFIG" in text
    for info in describe_settings():
        assert info.flag in text
        assert f"(default: {info.show_default()}; env: {info.env})" in text
    assert "--no-repair" in text
    assert "flags > environment > config file > defaults" in text


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_arg_parser().parse_args(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("ackbus-broker ")


def test_direct_construction_validates_and_coerces() -> None:
    settings = Settings(data_dir="somewhere", log_file="b.log", header_timeout_s=3)  # type: ignore[arg-type]
    assert settings.data_dir == pathlib.Path("somewhere")
    assert settings.log_file == pathlib.Path("b.log")
    assert isinstance(settings.header_timeout_s, float)
    with pytest.raises(ConfigError, match=r"port = 99999 from Settings\(\)"):
        Settings(port=99999)
    with pytest.raises(ConfigError, match="must be an integer, not a string"):
        Settings(port="80")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="default_lease_s"):
        dataclasses.replace(settings, default_lease_s=50_000.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1  # type: ignore[misc]


def test_as_dict_is_json_friendly() -> None:
    data = Settings(log_file=pathlib.Path("/tmp/x.log")).as_dict()
    assert json.loads(json.dumps(data))["log_file"] == "/tmp/x.log"
    assert data["data_dir"] == "data"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("65536", 65536),
        ("16_777_216", 16 * MiB),
        ("16MiB", 16 * MiB),
        ("16 mib", 16 * MiB),
        ("64m", 64 * MiB),
        ("512k", 512 * KiB),
        ("512KiB", 512 * KiB),
        ("2g", 2 * GiB),
        ("1MB", 1_000_000),
        ("1kB", 1000),
        ("7B", 7),
        (" 3 ", 3),
        ("-1k", -1024),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "1.5MiB", "1 parsec", "1e6", "0x10", "1 2"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


@given(st.integers(min_value=0, max_value=2**62))
def test_format_size_round_trips(n: int) -> None:
    assert parse_size(format_size(n)) == n


def test_operations_doc_lists_every_setting() -> None:
    """The configuration reference in docs/operations.md must not drift from the code."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    for info in describe_settings():
        row = f"| `{info.name}` | `{info.flag}` | `{info.env}` | `{info.show_default()}` |"
        assert row in doc, f"docs/operations.md lacks the row for {info.name}: {row}"


def test_fsync_syntax_is_the_storage_layers() -> None:
    """One parser for the fsync policy (broker.storage.parse_fsync_policy): every form
    the WAL accepts, the settings accept, normalised to the WAL's text form."""
    from broker.storage import parse_fsync_policy

    for text in (" Interval = 50 ", "INTERVAL=50", "always", " never"):
        value = load_settings(["--fsync", text], {}).fsync
        assert value == str(parse_fsync_policy(text))


def test_every_runtime_and_core_option_is_a_setting_with_the_layers_default() -> None:
    """One home per default: the settings table takes each one from the layer whose
    options carry it, and Settings.section builds those options by name, so a field
    added to RuntimeOptions or CoreConfig without a setting (or a default restated
    in the table) fails here."""
    import dataclasses

    from broker.http import Limits
    from broker.runtime import RuntimeOptions

    infos = {info.name: info for info in describe_settings()}
    for f in dataclasses.fields(RuntimeOptions):
        assert f.name in infos, f"RuntimeOptions.{f.name} has no setting"
        if f.name != "data_dir":  # the runtime's None is "memory only"; the CLI's is ./data
            assert infos[f.name].default == f.default, f.name
    for f in dataclasses.fields(Limits):
        if f.name in infos:
            assert infos[f.name].default == f.default, f.name
    settings = Settings(port=0, max_queues=7, queue_memory_messages=3, max_connections=5)
    options = settings.section(RuntimeOptions)
    assert (options.max_queues, options.queue_memory_messages, options.data_dir) == (7, 3, settings.data_dir)
    assert settings.section(Limits).max_connections == 5


def test_cluster_settings_are_checked_together() -> None:
    ok = load_settings(["--etcd", "http://127.0.0.1:2379,http://h2:2379", "--node-name", "a", "--advertise-url", "http://a:8080"], {})
    assert ok.etcd and ok.cluster_name == "ackbus"
    for argv, setting in (
        (["--etcd", "http://127.0.0.1:2379"], "node_name"),
        (["--etcd", "127.0.0.1:2379", "--node-name", "a", "--advertise-url", "http://a"], "etcd"),
        (["--etcd", "http://e1:2379", "--node-name", "a", "--advertise-url", "http://a", "--cluster-name", "a/b"],
         "cluster_name"),
    ):
        with pytest.raises(ConfigError) as caught:
            load_settings(argv, {})
        assert caught.value.setting == setting


def test_etcd_tls_and_user_settings_are_checked_together() -> None:
    base = ["--node-name", "a", "--advertise-url", "http://a:8080"]
    ok = load_settings(
        ["--etcd", "https://e1:2379,https://e2:2379", *base, "--etcd-ca-file", "ca.pem", "--etcd-cert", "c.pem",
         "--etcd-key", "c.key", "--etcd-user", "ack"], {"ACKBUS_ETCD_PASSWORD": "pw"},
    )
    assert (ok.etcd_user, ok.etcd_password, ok.etcd_cert) == ("ack", "pw", pathlib.Path("c.pem"))
    assert ok.as_dict()["etcd_password"] == "(set)" and "'pw'" not in str(ok.as_dict())
    for argv, environ, setting, says in (
        (["--etcd", "https://e1:2379,http://e2:2379"], {}, "etcd", "mixes http:// and https://"),
        (["--etcd", "https://e1:2379", "--etcd-key", "k"], {}, "etcd_key", "etcd_cert and etcd_key together"),
        (["--etcd", "http://e1:2379", "--etcd-ca-file", "ca.pem"], {}, "etcd_ca_file", "https://"),
        (["--etcd", "https://e1:2379", "--etcd-user", "ack"], {}, "etcd_user", "needs a password"),
        (["--etcd", "https://e1:2379", "--etcd-password-file", "f"], {}, "etcd_password_file", "needs etcd_user"),
        (["--etcd", "https://e1:2379", "--etcd-user", "u", "--etcd-password-file", "f"], {"ACKBUS_ETCD_PASSWORD": "p"},
         "etcd_password_file", "one way"),
    ):
        with pytest.raises(ConfigError, match=says) as caught:
            load_settings([*argv, *base], environ)
        assert caught.value.setting == setting
    with pytest.raises(ConfigError, match="needs cluster_cert and cluster_key together") as caught:
        load_settings(["--etcd", "https://e1:2379", *base, "--cluster-key", "k.pem"], {})
    assert caught.value.setting == "cluster_key"


def test_the_cluster_secret_is_never_shown() -> None:
    """The start-up log line and /overview show settings: a secret only as set."""
    shown = Settings(etcd="http://127.0.0.1:2379", node_name="a", advertise_url="http://a:1", cluster_secret="s3cret").as_dict()
    assert shown["cluster_secret"] == "(set)" and "s3cret" not in str(shown)
    assert Settings().as_dict()["cluster_secret"] == ""
