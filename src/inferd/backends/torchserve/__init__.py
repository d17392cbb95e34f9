"""TorchServe model archives served as inferd models, their handlers unmodified.

The server side is ``backend`` (config completion from the archive, the worker recipe),
``archive`` (reading and unpacking ``.mar`` files) and ``settings`` (TorchServe's front-end
settings per version); the worker side is ``executor`` (runs the handler on batches) and
``compat/ts``: the ``ts`` package that handlers import (``ts.context``,
``ts.torch_handler.base_handler``, ``ts.utils.util``, ``ts.metrics``), placed on the worker's
``sys.path`` only, so the server never imports handler code or a ``ts`` module.
"""
