"""The one error of settings: what the CLI prints before it exits 2."""

from __future__ import annotations

__all__ = ["ConfigError"]


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
