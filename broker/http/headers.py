"""Read-only, case-insensitive view of a request's header fields.

h11 hands over header names already lowercased (field names are case-insensitive,
RFC 9110 section 5.1) and values as bytes. This view decodes lazily and only what a
handler asks for; values are decoded as ISO-8859-1, which maps every byte to one
character and so never fails (RFC 9110 section 5.5: octets beyond ASCII are opaque).
A handler wanting UTF-8 re-encodes: ``value.encode("latin-1").decode("utf-8")``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

__all__ = ["Headers"]


class Headers:
    """Header fields of one request, looked up by (any-case) name.

    Repeated fields are combined with ``", "`` by ``get``/``[]`` as RFC 9110 section
    5.3 allows; ``get_all`` returns them separately.
    """

    __slots__ = ("_map", "_raw")

    def __init__(self, raw: Sequence[tuple[bytes, bytes]]) -> None:
        self._raw = raw
        self._map: dict[str, list[str]] | None = None

    def _index(self) -> dict[str, list[str]]:
        mapping = self._map
        if mapping is None:
            mapping = {}
            for name, value in self._raw:
                mapping.setdefault(name.decode("ascii"), []).append(value.decode("latin-1"))
            self._map = mapping
        return mapping

    @property
    def raw(self) -> Sequence[tuple[bytes, bytes]]:
        """The ``(lowercased name, value)`` byte pairs in received order."""
        return self._raw

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value of ``name`` (repeats joined by ``", "``), or ``default``."""
        values = self._index().get(name.lower())
        if values is None:
            return default
        return values[0] if len(values) == 1 else ", ".join(values)

    def get_all(self, name: str) -> list[str]:
        """Every value of ``name`` in received order (empty if absent)."""
        return list(self._index().get(name.lower(), ()))

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._index()

    def __iter__(self) -> Iterator[str]:
        return iter(self._index())

    def __len__(self) -> int:
        return len(self._index())

    def items(self) -> Iterator[tuple[str, str]]:
        """Every ``(lowercased name, value)`` pair in received order, repeats included."""
        for name, value in self._raw:
            yield name.decode("ascii"), value.decode("latin-1")

    def __repr__(self) -> str:
        return f"Headers({list(self.items())!r})"
