"""Packaging beyond pyproject.toml: the top-level ``suites/`` folder (the bundled suites and
``claims.toml``) ships inside the package as ``harness/suites``, so an installed wheel finds
them through ``importlib.resources`` (:func:`harness.bundled`). setuptools' ``package_dir``
maps a package onto another folder; pyproject.toml cannot add a mapped package to the ones
``packages.find`` discovers, so that one line of the configuration lives here."""

from setuptools import find_packages, setup

CODE = ["harness", "harness.*", "implementations", "implementations.*"]

setup(
    packages=[*find_packages(include=CODE), "harness.suites"],
    package_dir={"harness.suites": "suites"},
    package_data={"harness": ["py.typed"], "harness.suites": ["*.toml"]},
)
