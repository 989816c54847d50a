"""Installs the repository's root folders under one import namespace.

The folders ``compress/``, ``export/`` and ``runtime_bench/`` stay at the repository root (the project card fixes
them), but they install as ``minreal.compress``, ``minreal.export`` and ``minreal.runtime_bench``, beside the
application ``minreal.app`` and the shared facts ``minreal.facts`` that live in ``minreal/``. Everything else about
the distribution is in ``pyproject.toml``; this file only computes the package list and the folder mapping, which
``pyproject.toml`` cannot express without listing every subpackage by hand.
"""

from setuptools import find_packages, setup

FOLDERS = ("compress", "export", "runtime_bench")

setup(
    packages=["minreal", *find_packages(include=["minreal.*"]),
              *(f"minreal.{name}" for name in find_packages(include=[f"{f}{tail}" for f in FOLDERS
                                                                      for tail in ("", ".*")]))],
    package_dir={"minreal": "minreal", **{f"minreal.{folder}": folder for folder in FOLDERS}},
)
