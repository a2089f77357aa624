"""attnbench: a benchmark and complexity-profiling harness for attention implementations."""

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
