"""attnbench: a benchmark and complexity-profiling harness for attention implementations."""

__version__ = "0.1.0"
