"""The TorchServe version whose handler interface this package implements."""

__version__ = "0.12.0"
