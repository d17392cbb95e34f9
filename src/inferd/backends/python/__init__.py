"""The Python backend: ``model.py`` models, in Triton's form or inferd's native one, each
instance a worker process.

The server side is ``backend.PythonBackend`` (config completion, the worker recipe); the worker
side is ``host`` (builds the model's executor), ``triton`` and ``native`` (the two forms) and
``pb_utils`` (``triton_python_backend_utils`` as model code imports it). The worker side imports
no protobuf, so a model's own environment may pin any protobuf it likes.
"""
