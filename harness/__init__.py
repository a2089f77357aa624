"""attnbench: a benchmark and complexity-profiling harness for attention implementations."""

from pathlib import Path

__version__ = "0.1.0"

PROJECT_DIR = Path(__file__).resolve().parent.parent  # the checkout: suites/, results/
SUITES_DIR = PROJECT_DIR / "suites"
