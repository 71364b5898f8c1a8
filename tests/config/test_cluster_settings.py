"""Cluster settings without etcd: refused from every source, not ignored.

A broker without ``etcd`` is a single node; a cluster setting given to it (a
forgotten ``--etcd``, or one lost with the file or variable that held it) would start
a lone node its operator believes clustered. tests/test_config.py covers the rules
among the cluster settings once etcd is given.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import (
    ConfigError,
    SettingInfo,
    Settings,
    describe_settings,
    load_settings,
)

ROOT = Path(__file__).resolve().parent.parent.parent

#: A valid value (as text) of every setting of the cluster group but etcd itself.
CLUSTER_VALUES: dict[str, str] = {
    "etcd_ca_file": "ca.pem",
    "etcd_cert": "etcd.pem",
    "etcd_key": "etcd.key",
    "etcd_user": "ackbus",
    "etcd_password": "pw",
    "etcd_password_file": "pw.txt",
    "node_name": "a",
    "advertise_url": "http://a:8080",
    "cluster_name": "prod",
    "cluster_lease_ttl_s": "6",
    "replica_compact_entries": "500",
    "cluster_secret": "s3cret",
    "cluster_ca_file": "peers-ca.pem",
    "cluster_cert": "node.pem",
    "cluster_key": "node.key",
}

CLUSTER_SETTINGS = [info for info in describe_settings() if info.group == "cluster" and info.name != "etcd"]


def test_every_cluster_setting_is_covered_here() -> None:
    """A new cluster setting gets a value above, and so its test below."""
    assert sorted(info.name for info in CLUSTER_SETTINGS) == sorted(CLUSTER_VALUES)


@pytest.mark.parametrize("info", CLUSTER_SETTINGS, ids=lambda info: info.name)
def test_a_cluster_flag_without_etcd_is_refused(info: SettingInfo) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings([info.flag, CLUSTER_VALUES[info.name]], {})
    assert (caught.value.setting, caught.value.source) == (info.name, info.flag)
    assert f"{info.name} (from {info.flag}) is a cluster setting and needs etcd (--etcd" in caught.value.message
    assert "\n" not in caught.value.message


@pytest.mark.parametrize("info", CLUSTER_SETTINGS, ids=lambda info: info.name)
def test_a_cluster_environment_variable_without_etcd_is_refused(info: SettingInfo) -> None:
    """The environment is refused as flags are: ACKBUS_ETCD is as easily left out as
    --etcd, and ACKBUS_* variables are read by nothing else."""
    with pytest.raises(ConfigError, match="needs etcd") as caught:
        load_settings([], {info.env: CLUSTER_VALUES[info.name]})
    assert (caught.value.setting, caught.value.source) == (info.name, f"environment variable {info.env}")


def test_cluster_settings_in_a_config_file_without_etcd_are_refused_all_named(tmp_path: Path) -> None:
    config = tmp_path / "ackbus.toml"
    config.write_text('node_name = "a"\nadvertise_url = "http://a:8080"\ncluster_lease_ttl_s = 6\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(["--config", str(config)], {})
    source = f"config file {config}"
    assert caught.value.message.startswith(
        f"node_name (from {source}), advertise_url (from {source}), cluster_lease_ttl_s (from {source}) "
        "are cluster settings and need etcd"
    )
    assert caught.value.setting == "node_name"


def test_the_same_settings_with_etcd_are_taken() -> None:
    settings = load_settings(
        ["--etcd", "http://127.0.0.1:2379", "--cluster-name", "prod"],
        {"ACKBUS_NODE_NAME": "a", "ACKBUS_ADVERTISE_URL": "http://a:8080"},
    )
    assert (settings.node_name, settings.advertise_url, settings.cluster_name) == ("a", "http://a:8080", "prod")


def test_a_default_value_given_explicitly_is_still_given() -> None:
    """``--cluster-name ackbus`` is the default's value, but someone asked for a cluster."""
    with pytest.raises(ConfigError, match="cluster_name .from --cluster-name. is a cluster setting"):
        load_settings(["--cluster-name", "ackbus"], {})
    with pytest.raises(ConfigError, match="cluster_lease_ttl_s"):
        load_settings([], {"ACKBUS_CLUSTER_LEASE_TTL_S": "4"})


def test_empty_values_mean_not_set() -> None:
    """An empty variable (a template that filled in nothing) sets nothing, so it is no
    cluster setting given."""
    environ = {"ACKBUS_NODE_NAME": "", "ACKBUS_ETCD_PASSWORD": "", "ACKBUS_CLUSTER_CERT": "", "ACKBUS_ETCD": ""}
    settings = load_settings(["--advertise-url", ""], environ)
    assert (settings.etcd, settings.node_name, settings.cluster_cert) == ("", "", None)


def test_settings_built_directly_follow_the_same_rule() -> None:
    assert Settings().cluster_name == "ackbus"
    assert Settings(cluster_name="ackbus", cluster_lease_ttl_s=4).etcd == ""  # the defaults: nothing given
    with pytest.raises(ConfigError, match=r"node_name \(from Settings\(\)\) is a cluster setting") as caught:
        Settings(node_name="a")
    assert caught.value.setting == "node_name"
    clustered = Settings(etcd="http://127.0.0.1:2379", node_name="a", advertise_url="http://a:1")
    assert clustered.node_name == "a"


def test_the_broker_process_exits_2_naming_the_flag(tmp_path: Path) -> None:
    """``python -m broker --node-name a`` without --etcd: exit status 2, one line on
    stderr that names the flag and says it needs etcd; nothing started or written."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACKBUS_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["ACKBUS_CLUSTER_SECRET"] = "s3cret"
    data = tmp_path / "data"
    result = subprocess.run(
        [sys.executable, "-m", "broker", "--port", "0", "--amqp-port", "0", "--data-dir", str(data),
         "--node-name", "a", "--advertise-url", "http://127.0.0.1:1"],
        env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "ackbus-broker: node_name (from --node-name), advertise_url (from --advertise-url), cluster_secret "
        "(from environment variable ACKBUS_CLUSTER_SECRET) are cluster settings and need etcd (--etcd"
    ), lines[0]
    assert "s3cret" not in result.stderr
    assert not data.exists(), "the broker touched its data directory before refusing its settings"
