"""attnbench: a benchmark and complexity-profiling harness for attention implementations."""

import fnmatch
from importlib.resources import files
from pathlib import Path

__version__ = "0.1.0"

PROJECT_DIR = Path(__file__).resolve().parent.parent  # the checkout: suites/, results/
SUITES_DIR = PROJECT_DIR / "suites"


def bundled(name: str) -> Path:
    """A bundled suite or claims file (``smoke.toml``, ``claims.toml``): the copy installed in
    the package (a wheel maps the top-level ``suites/`` folder to ``harness/suites``, read
    through importlib.resources), else the checkout's ``suites/`` (a source tree or an
    editable install)."""
    installed = files(__name__).joinpath("suites", name)
    return Path(str(installed)) if installed.is_file() else SUITES_DIR / name


def bundled_files(pattern: str) -> list[Path]:
    """The bundled suites and claims files whose names match ``pattern`` (``claims-*cpu*.toml``),
    sorted by name, from where :func:`bundled` reads them."""
    installed = files(__name__).joinpath("suites")
    folder = Path(str(installed)) if installed.is_dir() else SUITES_DIR
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if fnmatch.fnmatch(p.name, pattern))
