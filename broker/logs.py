"""Log output of the broker: one line per record, human-readable or JSON.

The broker logs through the stdlib :mod:`logging` module, under loggers named
``ackbus.*`` (``ackbus.http``, ``ackbus.storage.wal`` …). This module only decides what a
record looks like and where it goes:

- ``human`` (default)::

      2025-01-02T03:04:05.678Z INFO    ackbus.wal: checkpoint written lsn=900 bytes=1234

  UTC timestamp with milliseconds, level, logger, message, then the record's structured
  fields as ``key=value`` (values quoted when they contain spaces, quotes or ``=``).
  Control characters in the message are escaped, so a queue name with a newline in it
  cannot forge a second log line; a traceback follows on indented lines.
- ``json``: one JSON object per line with ``ts``, ``level``, ``logger``, ``msg``, the
  fields, and ``exc`` (the traceback) when there is one. A field whose name collides
  with one of those keys gets a trailing underscore (``msg_``).

Structured fields reach a record in either of two ways::

    logger.info("queue declared", extra={"fields": {"queue": name, "durable": True}})
    log_event(logger, logging.INFO, "queue declared", queue=name, durable=True)

(plain ``extra={"queue": name}`` attributes are shown as fields too).

The handler is installed on the root logger so that every record, including a
library's warning, comes out in one format: a JSON log stream with one non-JSON line in
it breaks the pipeline that reads it. :func:`reopen_log_files` serves SIGHUP after
logrotate has renamed the file: the next record goes to a new file at the same path.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import IO, Any, Final

from broker.config import ConfigError

__all__ = [
    "HumanFormatter",
    "JsonFormatter",
    "configure_logging",
    "log_event",
    "record_fields",
    "reopen_log_files",
    "reset_logging",
]

_LEVELS: Final[Mapping[str, int]] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}

# The attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS: Final = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "fields",
    "taskName",  # added to LogRecord in Python 3.12
}

_JSON_RESERVED: Final = frozenset({"ts", "level", "logger", "msg", "exc"})

# Bare in the human format: what a logfmt reader (and a person) takes as one token.
_BARE_VALUE: Final = re.compile(r"[^\s\"=\\\x00-\x1f\x7f]+")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields of a record: ``extra={"fields": {...}}`` plus other extras."""
    fields: dict[str, Any] = {}
    for key, value in record.__dict__.items():
        if key not in _STANDARD_ATTRS and not key.startswith("_"):
            fields[key] = value
    given = record.__dict__.get("fields")
    if isinstance(given, Mapping):
        fields.update(given)
    return fields


def _timestamp(record: logging.LogRecord) -> str:
    seconds = int(record.created)
    millis = int((record.created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _escape_control(text: str) -> str:
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _human_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    text = value if isinstance(value, str) else str(value)
    if _BARE_VALUE.fullmatch(text):
        return text
    return json.dumps(text, ensure_ascii=False)


class HumanFormatter(logging.Formatter):
    """``<UTC time> <LEVEL> <logger>: <message> key=value …``, traceback indented below."""

    def format(self, record: logging.LogRecord) -> str:
        message = _escape_control(record.getMessage())
        parts = [_timestamp(record), f"{record.levelname:<7}", f"{record.name}:", message]
        for key, value in record_fields(record).items():
            parts.append(f"{key}={_human_value(value)}")
        line = " ".join(parts)
        extra = self._trailer(record)
        if extra:
            line += "\n" + "\n".join("    " + part for part in extra.splitlines())
        return line

    def _trailer(self, record: logging.LogRecord) -> str:
        chunks = []
        if record.exc_info:
            chunks.append(self.formatException(record.exc_info))
        elif record.exc_text:
            chunks.append(record.exc_text)
        if record.stack_info:
            chunks.append(self.formatStack(record.stack_info))
        return "\n".join(chunks)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line; values JSON cannot hold become strings."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record_fields(record).items():
            while key in obj or key in _JSON_RESERVED:
                key += "_"
            obj[key] = value
        trailer = []
        if record.exc_info:
            trailer.append(self.formatException(record.exc_info))
        elif record.exc_text:
            trailer.append(record.exc_text)
        if record.stack_info:
            trailer.append(self.formatStack(record.stack_info))
        if trailer:
            obj["exc"] = "\n".join(trailer)
        return json.dumps(obj, ensure_ascii=False, default=str, separators=(",", ":"))


class _ReopenableFileHandler(logging.FileHandler):
    """A file handler whose file can be swapped for a fresh one at the same path."""

    def reopen(self) -> None:
        """Open the path anew, then close the old file; on OSError keep the old one.

        Holds the handler lock, so a record emitted from a worker thread meanwhile goes
        wholly to the old file or wholly to the new one.
        """
        self.acquire()
        try:
            new_stream = self._open()
            old_stream, self.stream = self.stream, new_stream
        finally:
            self.release()
        if old_stream is not None:
            old_stream.close()


# The handler this module installed, so that it can be replaced or removed. One
# process, one logging configuration: module state is the honest place for it.
_installed: logging.Handler | None = None


def configure_logging(
    level: str = "info",
    format: str = "human",
    file: str | os.PathLike[str] | None = None,
    *,
    stream: IO[str] | None = None,
) -> None:
    """Send every log record at ``level`` or above, in ``format``, to ``file``.

    ``level`` is debug|info|warning|error; ``format`` is human|json; ``file`` None means
    ``stream`` (default: ``sys.stderr``). The file is opened for appending at once, so
    that an unwritable path fails at start. Calling it again replaces the previous
    configuration. The arguments mirror ``Settings.log_level``, ``log_format`` and
    ``log_file``.

    Raises ConfigError for an unknown level or format or a log file that cannot be
    opened.
    """
    global _installed
    try:
        numeric_level = _LEVELS[level]
    except KeyError:
        raise ConfigError(f"log_level = {level!r}: must be one of {', '.join(_LEVELS)}", setting="log_level") from None
    formatter: logging.Formatter
    if format == "human":
        formatter = HumanFormatter()
    elif format == "json":
        formatter = JsonFormatter()
    else:
        raise ConfigError(f"log_format = {format!r}: must be human or json", setting="log_format")

    handler: logging.Handler
    if file is not None:
        try:
            handler = _ReopenableFileHandler(file, mode="a", encoding="utf-8", errors="backslashreplace")
        except OSError as exc:
            raise ConfigError(
                f"log_file = {os.fspath(file)!r}: cannot open: {exc.strerror or exc}", setting="log_file"
            ) from exc
    else:
        handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)

    reset_logging()
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(numeric_level)
    _installed = handler


def reset_logging() -> None:
    """Remove and close the handler :func:`configure_logging` installed, if any."""
    global _installed
    if _installed is not None:
        logging.getLogger().removeHandler(_installed)
        _installed.close()
        _installed = None


def reopen_log_files() -> None:
    """Reopen the log file (for SIGHUP after logrotate renamed it); no-op without one.

    Fast and non-blocking apart from one ``open()``, so it may run on the trio thread,
    e.g. in the task that reads ``trio.open_signal_receiver(signal.SIGHUP)`` (not in a
    raw signal handler: it takes the handler's lock).

    Raises OSError when the path cannot be opened; logging then continues to the old
    file.
    """
    handler = _installed
    if isinstance(handler, _ReopenableFileHandler):
        handler.reopen()


def log_event(logger: logging.Logger, level: int | str, msg: str, /, **fields: Any) -> None:
    """Log ``msg`` with structured ``fields``: ``log_event(log, "info", "bound", queue=q)``.

    ``level`` is a logging constant or one of debug|info|warning|error. Costs one level
    check when the level is disabled. Raises KeyError for an unknown level name.
    """
    numeric = _LEVELS[level] if isinstance(level, str) else level
    if logger.isEnabledFor(numeric):
        logger.log(numeric, msg, extra={"fields": fields}, stacklevel=2)
