"""Which build of the per-message path runs: ``compiled`` when the core's
modules were loaded as extension modules built by mypyc from their source (the
compiled build, docs/benchmarks.md "The builds"), else ``interpreted``. Shown by
``GET /overview`` (``build``) and ``python -m broker --version``."""

from __future__ import annotations

import sys
from importlib.machinery import EXTENSION_SUFFIXES

from broker.core import Broker

__all__ = ["build_name"]


def build_name() -> str:
    module = sys.modules.get(Broker.__module__)
    origin = getattr(module, "__file__", None) or ""
    if any(origin.endswith(suffix) for suffix in EXTENSION_SUFFIXES):
        return "compiled"
    return "interpreted"
