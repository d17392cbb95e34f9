"""The package's version, in a module of its own so any module can read it without importing
the package's ``__init__`` (which names the public API)."""

__version__ = "0.1.0"
