"""The rules that involve more than one setting: files that come in pairs, the etcd
endpoints with how the node gets into etcd, and the cluster settings that mean
something only with etcd.

They are checked on the values of every source together, after the precedence chose
one value per setting, by the loader and by ``Settings()`` alike. ``sources`` says
where each value came from (``--port``, ``environment variable ACKBUS_PORT``,
``config file PATH``, ``Settings()``), and ``default`` for a setting nobody gave.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any, Final

from broker.config.errors import ConfigError

__all__ = ["DEFAULT_SOURCE", "check_together"]

#: The source of a setting nobody gave.
DEFAULT_SOURCE: Final = "default"


def check_together(values: Mapping[str, Any], sources: Mapping[str, str], *, cluster_only: Collection[str]) -> None:
    """Raise :class:`ConfigError` for the first rule the settings break.

    ``cluster_only`` names the settings that mean something only in a cluster: given
    without ``etcd``, they are refused rather than ignored, since a broker started so
    runs as a single node while its operator believes it joined a cluster.
    """
    if values["etcd"]:
        _check_etcd(values, sources)
    else:
        _check_no_cluster_settings(values, sources, cluster_only)
    if (values["tls_cert"] is None) != (values["tls_key"] is None):
        given = "tls_cert" if values["tls_cert"] is not None else "tls_key"
        raise ConfigError(
            f"{given} (from {sources[given]}) needs tls_cert and tls_key together", setting=given, source=sources[given]
        )
    if values["tls_client_ca"] is not None and values["tls_cert"] is None:
        raise ConfigError(
            f"tls_client_ca (from {sources['tls_client_ca']}) needs tls_cert and tls_key",
            setting="tls_client_ca", source=sources["tls_client_ca"],
        )
    if values["default_lease_s"] > values["max_lease_s"]:
        raise ConfigError(
            f"default_lease_s = {values['default_lease_s']:g} (from {sources['default_lease_s']}) "
            f"must not exceed max_lease_s = {values['max_lease_s']:g} (from {sources['max_lease_s']})",
            setting="default_lease_s",
            source=sources["default_lease_s"],
        )


def _check_no_cluster_settings(
    values: Mapping[str, Any], sources: Mapping[str, str], cluster_only: Collection[str]
) -> None:
    """Without etcd, no cluster setting may be given (from any source).

    A setting counts as given when a source other than the defaults set it to a value
    (an empty one means "not set" and counts for nothing), or, for ``Settings()``,
    when its value is not the default.
    """
    given = [
        name for name in cluster_only
        if sources[name] != DEFAULT_SOURCE and values[name] not in (None, "")
    ]
    if not given:
        return
    named = ", ".join(f"{name} (from {sources[name]})" for name in given)
    what = "is a cluster setting" if len(given) == 1 else "are cluster settings"
    raise ConfigError(
        f"{named} {what} and need{'s' if len(given) == 1 else ''} etcd (--etcd, ACKBUS_ETCD or etcd in the "
        "config file), which is not set: without it the broker would start as a single node and ignore "
        f"{'it' if len(given) == 1 else 'them'}",
        setting=given[0], source=sources[given[0]],
    )


def _check_etcd(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """The etcd endpoints, how the node gets into etcd (TLS, users) and the other
    cluster settings fit together."""
    source = sources["etcd"]
    schemes = set()
    for url in values["etcd"].split(","):
        found = re.fullmatch(r"\s*(https?)://[^/\s:,]+(:\d{1,5})?/?\s*", url)
        if found is None:
            raise ConfigError(
                f"etcd = {values['etcd']!r} from {source}: each endpoint must look like "
                f"http://HOST:PORT or https://HOST:PORT, not {url.strip()!r}", setting="etcd", source=source,
            )
        schemes.add(found.group(1))
    if len(schemes) > 1:
        raise ConfigError(
            f"etcd = {values['etcd']!r} from {source}: mixes http:// and https:// endpoints; use https:// for all "
            "(one plain endpoint would carry in clear what the others protect)", setting="etcd", source=source,
        )
    _check_pair(values, sources, "etcd_cert", "etcd_key")
    if schemes == {"http"}:
        for name in ("etcd_ca_file", "etcd_cert"):
            if values[name] is not None:
                raise ConfigError(
                    f"{name} (from {sources[name]}) is for https:// etcd endpoints, but etcd = {values['etcd']!r} "
                    f"(from {source}) is plain http://", setting=name, source=sources[name],
                )
    password_from = [name for name in ("etcd_password", "etcd_password_file") if values[name]]
    if len(password_from) > 1:
        raise ConfigError(
            f"etcd_password (from {sources['etcd_password']}) and etcd_password_file (from "
            f"{sources['etcd_password_file']}): give the password one way", setting="etcd_password_file",
            source=sources["etcd_password_file"],
        )
    if values["etcd_user"] and not password_from:
        raise ConfigError(
            f"etcd_user (from {sources['etcd_user']}) needs a password: etcd_password_file or the environment "
            "variable ACKBUS_ETCD_PASSWORD", setting="etcd_user", source=sources["etcd_user"],
        )
    if password_from and not values["etcd_user"]:
        name = password_from[0]
        raise ConfigError(
            f"{name} (from {sources[name]}) needs etcd_user: the user the password is of", setting=name,
            source=sources[name],
        )
    _check_pair(values, sources, "cluster_cert", "cluster_key")
    for name in ("node_name", "advertise_url"):
        if not values[name]:
            raise ConfigError(
                f"etcd (from {source}) needs {name} too: a node joins a cluster under a "
                "stable name, at a URL the other nodes can reach",
                setting=name, source=source,
            )
    if not all(c.isalnum() or c in "-_." for c in values["cluster_name"]):
        raise ConfigError(
            f"cluster_name = {values['cluster_name']!r} (from {sources['cluster_name']}): "
            "letters, digits, '-', '_' and '.' only", setting="cluster_name", source=sources["cluster_name"],
        )


def _check_pair(values: Mapping[str, Any], sources: Mapping[str, str], cert: str, key: str) -> None:
    """A certificate and its key: both or neither."""
    if (values[cert] is None) != (values[key] is None):
        given = cert if values[cert] is not None else key
        raise ConfigError(
            f"{given} (from {sources[given]}) needs {cert} and {key} together", setting=given, source=sources[given]
        )
