"""Query-string parameters with typed, bounded getters that fail as ``400``.

Handlers never call ``int(...)`` on user input themselves: each getter names the
parameter in its error (``InvalidRequest``, status 400), so a client learns exactly
which parameter was wrong and why. Parsing follows the URL standard's
``application/x-www-form-urlencoded`` rules (``+`` is a space, ``%XX`` is a byte, the
bytes are UTF-8), as ``urllib.parse.parse_qsl`` implements them, and happens lazily on
first use: most requests carry no query at all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from typing import Final, TypeVar, overload
from urllib.parse import parse_qsl

from broker.http.errors import InvalidRequest

__all__ = ["QueryParams"]

_D = TypeVar("_D")

#: More fields than this in one query string is an attack or a bug, not a request.
MAX_FIELDS: Final = 256

_INT_RE: Final = re.compile(r"-?[0-9]{1,19}")
_FLOAT_RE: Final = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")
_TRUE: Final = frozenset({"true", "1"})
_FALSE: Final = frozenset({"false", "0"})


class _Missing:
    """Marks a getter call without a default: the parameter is required."""

    def __repr__(self) -> str:
        return "MISSING"


_MISSING: Final = _Missing()


def _show(value: str) -> str:
    """Quote a client-supplied value for an error message, truncated."""
    return repr(value if len(value) <= 64 else value[:64] + "...")


class QueryParams:
    """The decoded parameters of one request's query string.

    Every typed getter takes the parameter ``name`` and an optional ``default``; without
    a default the parameter is required. A parameter given more than once is an error
    for the typed getters (which value would win is ambiguous); ``get_all`` returns
    every value.

    Raises (from every getter): ``InvalidRequest`` -- missing, repeated, malformed or
    out of bounds, with a message naming the parameter.
    """

    __slots__ = ("_map", "_pairs", "_raw")

    def __init__(self, query_string: str) -> None:
        self._raw = query_string
        self._pairs: list[tuple[str, str]] | None = None
        self._map: dict[str, list[str]] | None = None

    @property
    def raw(self) -> str:
        """The query string as received, without the leading ``?``."""
        return self._raw

    def _parsed(self) -> dict[str, list[str]]:
        if self._map is None:
            pairs: list[tuple[str, str]] = []
            if self._raw:
                try:
                    pairs = parse_qsl(
                        self._raw,
                        keep_blank_values=True,
                        errors="strict",
                        max_num_fields=MAX_FIELDS,
                    )
                except UnicodeDecodeError as exc:
                    raise InvalidRequest(f"query string is not valid UTF-8: {exc}") from None
                except ValueError as exc:
                    raise InvalidRequest(f"malformed query string: {exc}") from None
            mapping: dict[str, list[str]] = {}
            for key, value in pairs:
                mapping.setdefault(key, []).append(value)
            self._pairs = pairs
            self._map = mapping
        return self._map

    def __contains__(self, name: object) -> bool:
        return name in self._parsed()

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsed())

    def __len__(self) -> int:
        return len(self._parsed())

    def __repr__(self) -> str:
        return f"QueryParams({self._raw!r})"

    def items(self) -> list[tuple[str, str]]:
        """Every ``(name, value)`` pair in order, repeats included."""
        self._parsed()
        assert self._pairs is not None
        return list(self._pairs)

    def get_all(self, name: str) -> list[str]:
        """Every value of ``name``, in order (empty if absent)."""
        return list(self._parsed().get(name, ()))

    def _one(self, name: str) -> str | None:
        values = self._parsed().get(name)
        if values is None:
            return None
        if len(values) > 1:
            raise InvalidRequest(f"query parameter {name!r} is given more than once")
        return values[0]

    @staticmethod
    def _required(name: str) -> InvalidRequest:
        return InvalidRequest(f"missing required query parameter {name!r}")

    # -- str -----------------------------------------------------------------------

    @overload
    def get_str(
        self,
        name: str,
        *,
        max_length: int | None = None,
        choices: Sequence[str] | None = None,
    ) -> str: ...

    @overload
    def get_str(
        self,
        name: str,
        default: _D,
        *,
        max_length: int | None = None,
        choices: Sequence[str] | None = None,
    ) -> str | _D: ...

    def get_str(
        self,
        name: str,
        default: object = _MISSING,
        *,
        max_length: int | None = None,
        choices: Sequence[str] | None = None,
    ) -> object:
        """``name`` as text, at most ``max_length`` characters, one of ``choices``."""
        value = self._one(name)
        if value is None:
            if default is _MISSING:
                raise self._required(name)
            return default
        if max_length is not None and len(value) > max_length:
            raise InvalidRequest(
                f"query parameter {name!r} is longer than {max_length} characters"
            )
        if choices is not None and value not in choices:
            raise InvalidRequest(
                f"query parameter {name!r} must be one of {', '.join(choices)}; got {_show(value)}"
            )
        return value

    # -- int -----------------------------------------------------------------------

    @overload
    def get_int(
        self, name: str, *, min_value: int | None = None, max_value: int | None = None
    ) -> int: ...

    @overload
    def get_int(
        self,
        name: str,
        default: _D,
        *,
        min_value: int | None = None,
        max_value: int | None = None,
    ) -> int | _D: ...

    def get_int(
        self,
        name: str,
        default: object = _MISSING,
        *,
        min_value: int | None = None,
        max_value: int | None = None,
    ) -> object:
        """``name`` as a decimal integer within ``[min_value, max_value]``."""
        value = self._one(name)
        if value is None:
            if default is _MISSING:
                raise self._required(name)
            return default
        if _INT_RE.fullmatch(value) is None:
            raise InvalidRequest(
                f"query parameter {name!r} must be an integer; got {_show(value)}"
            )
        number = int(value)
        _check_bounds(name, number, min_value, max_value)
        return number

    # -- float ---------------------------------------------------------------------

    @overload
    def get_float(
        self, name: str, *, min_value: float | None = None, max_value: float | None = None
    ) -> float: ...

    @overload
    def get_float(
        self,
        name: str,
        default: _D,
        *,
        min_value: float | None = None,
        max_value: float | None = None,
    ) -> float | _D: ...

    def get_float(
        self,
        name: str,
        default: object = _MISSING,
        *,
        min_value: float | None = None,
        max_value: float | None = None,
    ) -> object:
        """``name`` as a finite decimal number within ``[min_value, max_value]``.

        ``nan``, ``inf`` and Python-only spellings (``1_000``) are rejected.
        """
        value = self._one(name)
        if value is None:
            if default is _MISSING:
                raise self._required(name)
            return default
        number = float(value) if _FLOAT_RE.fullmatch(value) else math.nan
        if not math.isfinite(number):
            raise InvalidRequest(f"query parameter {name!r} must be a number; got {_show(value)}")
        _check_bounds(name, number, min_value, max_value)
        return number

    # -- bool ----------------------------------------------------------------------

    @overload
    def get_bool(self, name: str) -> bool: ...

    @overload
    def get_bool(self, name: str, default: _D) -> bool | _D: ...

    def get_bool(self, name: str, default: object = _MISSING) -> object:
        """``name`` as a boolean: ``true``/``false``/``1``/``0`` (case-insensitive)."""
        value = self._one(name)
        if value is None:
            if default is _MISSING:
                raise self._required(name)
            return default
        lowered = value.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise InvalidRequest(
            f"query parameter {name!r} must be true, false, 1 or 0; got {_show(value)}"
        )


def _check_bounds(
    name: str, number: float, min_value: float | None, max_value: float | None
) -> None:
    if min_value is not None and number < min_value:
        raise InvalidRequest(
            f"query parameter {name!r} must be at least {min_value}; got {number}"
        )
    if max_value is not None and number > max_value:
        raise InvalidRequest(
            f"query parameter {name!r} must be at most {max_value}; got {number}"
        )
