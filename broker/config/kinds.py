"""Kinds of setting values: how each is read from text (flags, environment) or from a
Python value (TOML, direct construction), checked, and shown in ``--help``.

Sizes accept a unit: ``16MiB``, ``64m``, ``512k`` (powers of 1024) or ``1MB`` / ``1kB``
(powers of 1000, SI). Durations are seconds, fractions allowed. Booleans from text
accept ``true/false``, ``1/0``, ``yes/no``.
"""

from __future__ import annotations

import math
import pathlib
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

from broker.storage import InvalidConfiguration, parse_fsync_policy

__all__ = ["GiB", "KiB", "MiB", "format_size", "parse_size"]

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB


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


class _OptionalStr(_Str):
    """Text that may be empty (an empty value means "not set")."""

    def parse(self, text: str) -> Any:
        return text

    def show(self, value: Any) -> str:
        return value if value else "none"


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
    """The WAL's fsync policy; its syntax is the storage layer's, parsed there only."""

    metavar = "always|never|interval=MS"

    def parse(self, text: str) -> Any:
        try:
            return str(parse_fsync_policy(text))
        except InvalidConfiguration as exc:
            raise _Invalid(str(exc).partition(": ")[2] or str(exc)) from None


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
    """A path where the empty string (or None, in Python) means "not set" (shown as
    ``unset``, e.g. "stderr" for a log file, "none" for a TLS file)."""

    def __init__(self, unset: str = "stderr") -> None:
        self.unset = unset

    def parse(self, text: str) -> Any:
        return pathlib.Path(text) if text else None

    def coerce(self, value: object) -> Any:
        return None if value is None else super().coerce(value)

    def show(self, value: Any) -> str:
        return self.unset if value is None else super().show(value)


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


class _Watermark(_Kind):
    """The memory high watermark: a fraction of the memory the broker may use
    (``0.4``, or ``40%``), an absolute size (``1GiB``, or a byte count above 1), or 0
    (no alarm). Stored as one float: at most 1 a fraction, above 1 bytes."""

    metavar = "FRACTION|BYTES"
    type_name = "a fraction such as 0.4 or a size such as 1GiB"

    def parse(self, text: str) -> Any:
        stripped = text.strip()
        number: float | None = None
        try:
            number = float(stripped[:-1]) / 100 if stripped.endswith("%") else float(stripped)
        except ValueError:
            pass
        if number is not None:
            return self._check(number)
        try:
            size = parse_size(stripped)
        except ValueError:
            raise _Invalid(f"must be {self.type_name}") from None
        if size <= 1:
            raise _Invalid("a size must be more than 1 byte")
        return float(size)

    def coerce(self, value: object) -> Any:
        if isinstance(value, str):
            return self.parse(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Invalid(f"must be {self.type_name}, not {_toml_type(value)}")
        return self._check(float(value))

    @staticmethod
    def _check(value: float) -> float:
        if not math.isfinite(value) or value < 0:
            raise _Invalid("must be a fraction in 0..1 or a size above 1 byte")
        if value > 1 and value != int(value):
            raise _Invalid("above 1 it is a size in bytes, a whole number (or a fraction in 0..1)")
        return value

    def show(self, value: Any) -> str:
        return f"{value:g}" if value <= 1 else format_size(int(value))


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


_STR = _Str()
_OPTIONAL_STR = _OptionalStr()
_PATH = _Path()
_INT = _Int()
_SIZE = _Size()
_SECONDS = _Seconds()
_BOOL = _Bool()
_WATERMARK = _Watermark()
