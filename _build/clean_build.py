"""PEP 517 build backend: setuptools, after removing the in-tree ``build/`` folder.

``pip install .`` builds in the source tree, and setuptools copies modules into
``build/lib`` without ever deleting old ones, so a module removed from the
sources would come back in the next wheel. Every wheel here starts from an
empty ``build/``.
"""

from __future__ import annotations

import shutil

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - re-export every other PEP 517 / 660 hook


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):  # noqa: D103
    shutil.rmtree("build", ignore_errors=True)
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
