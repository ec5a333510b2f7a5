"""Compatibility module: the sweep code lives in :mod:`simulator.sweeps`; this re-exports its public names.

``simulator.sweep`` the *attribute* is the :func:`~simulator.sweeps.sweep`
function (see ``simulator/__init__.py``); this module is reached as
``importlib.import_module("simulator.sweep")``. Setting ``run_experiment`` on
it (as tests do with ``monkeypatch``) sets it where points run, in
:mod:`simulator.sweeps.worker`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .experiment import read_experiment_file  # noqa: F401 - public here before the split
from .sweeps import *  # noqa: F403 - every public name of the package
from .sweeps import __all__  # noqa: F401
from .sweeps import worker as _worker

_FORWARDED = frozenset({"run_experiment"})
"""Names read and written on :mod:`simulator.sweeps.worker` rather than here."""


class _CompatModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name in _FORWARDED:
            return getattr(_worker, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FORWARDED:
            setattr(_worker, name, value)
        else:
            super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if name in _FORWARDED:
            raise AttributeError(f"{name} is read from simulator.sweeps.worker; set it, do not delete it")
        super().__delattr__(name)


sys.modules[__name__].__class__ = _CompatModule
