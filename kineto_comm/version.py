"""The package's version: one home, below every module that writes it (the reports, the
cache key, `kineto-comm --version`, the wheel's metadata)."""

__version__ = "0.1.0"
