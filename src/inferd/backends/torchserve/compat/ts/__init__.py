"""``ts``: TorchServe's Python package as handlers import it, written for inferd's workers.

Only a worker process running a TorchServe handler has this folder on its path. The version is
TorchServe's (handlers and ``context.system_properties`` report it).
"""

from .version import __version__ as __version__
