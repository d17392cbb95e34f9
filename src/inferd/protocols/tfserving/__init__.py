"""TF Serving's gRPC messages, generated into inferd's private descriptor pool.

TensorFlow and tensorflow-serving-api register the same ``tensorflow.*`` names in protobuf's
default pool; ours live in ``inferd.protocols.pool.POOL`` so that all can share a process. The
well-known types the messages use must be in that pool first: this package adds them before
any of its generated modules registers.
"""

from __future__ import annotations

from google.protobuf import any_pb2, wrappers_pb2

from inferd.protocols.pool import POOL

for _file in (any_pb2.DESCRIPTOR, wrappers_pb2.DESCRIPTOR):
    try:
        POOL.FindFileByName(_file.name)
    except KeyError:
        POOL.AddSerializedFile(_file.serialized_pb)
