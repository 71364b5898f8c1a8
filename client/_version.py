"""The installed distribution's version (``client.__version__``, the User-Agent)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("ackbus")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
