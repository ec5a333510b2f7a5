"""Compatibility module: the sweep code lives in :mod:`simulator.sweeps`; this re-exports its public names.

``simulator.sweep`` the *attribute* is the :func:`~simulator.sweeps.sweep`
function (see ``simulator/__init__.py``); this module is reached as
``importlib.import_module("simulator.sweep")``. Points call
``run_experiment`` from :mod:`simulator.sweeps.worker`; patch it there.
"""

from __future__ import annotations

from .experiment import read_experiment_file  # noqa: F401 - public here before the split
from .sweeps import *  # noqa: F403 - every public name of the package
from .sweeps import __all__  # noqa: F401
