"""finecap's build backend (pyproject.toml's ``build-backend``): setuptools' own, each wheel built in a fresh folder.

setuptools copies the package into ``build/lib`` and builds the wheel from there, and never removes what was deleted
from ``src/`` since (pypa/setuptools#1871): a second ``pip wheel .`` in a clone shipped the modules and data files
deleted in between. :func:`build_wheel` gives setuptools' ``build`` command a new temporary ``build_base`` each time
(a distutils configuration file named by ``DIST_EXTRA_CONFIG``, read after ``setup.cfg`` and the user's own, merged
with one the user named there), removed afterwards: a ``build/`` folder of the clone is neither read nor written.
Every other hook is setuptools' (:mod:`setuptools.build_meta`). tests/repo/test_wheel.py builds twice with a module
deleted in between.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 (the hooks not redefined here)

EXTRA_CONFIG = "DIST_EXTRA_CONFIG"
"""The environment variable naming a distutils configuration file that setuptools reads last."""


@contextlib.contextmanager
def fresh_build_base() -> Iterator[Path]:
    """A new temporary folder, setuptools' ``build_base`` while the block runs (``DIST_EXTRA_CONFIG`` restored after,
    the folder removed)."""
    before = os.environ.get(EXTRA_CONFIG)
    with tempfile.TemporaryDirectory(prefix="finecap-build-") as tmp:
        config = configparser.ConfigParser()
        if before:
            config.read(before, encoding="utf-8")
        if not config.has_section("build"):
            config.add_section("build")
        config.set("build", "build_base", str(Path(tmp) / "build"))
        with open(Path(tmp) / "build.cfg", "w", encoding="utf-8") as f:
            config.write(f)
        os.environ[EXTRA_CONFIG] = str(Path(tmp) / "build.cfg")
        try:
            yield Path(tmp) / "build"
        finally:
            if before is None:
                os.environ.pop(EXTRA_CONFIG, None)
            else:
                os.environ[EXTRA_CONFIG] = before


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with fresh_build_base():
        return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
