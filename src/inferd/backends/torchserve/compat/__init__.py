"""The folder put first on a TorchServe worker's ``sys.path``: it holds the ``ts`` package."""
