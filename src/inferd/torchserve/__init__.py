"""TorchServe's APIs over inferd's data plane: models, predictions, management, errors.

``models`` is TorchServe's view of the registry and its predictions, ``management`` registers,
scales and unregisters archives in the model repository, ``errors`` answers in TorchServe's
words and ``forms`` reads the bodies TorchServe accepts. The adapters live in
``inferd.protocols.torchserve`` (``http``, ``management_http``, ``grpc``).
"""
