"""inferd's own protobuf descriptor pool, holding the KServe v2 gRPC messages (``inference.*``).

tritonclient, MLServer and KServe each register the same ``inference.*`` names in protobuf's
process-wide default pool, and a second registration of a name fails the import. The
generated ``grpc_service_pb2`` therefore registers here (scripts/gen-protos points it at this
pool), so inferd and those packages can be imported in one process.
"""

from __future__ import annotations

from google.protobuf import descriptor_pool

from inferd.config import model_config_pb2

POOL = descriptor_pool.DescriptorPool()
# grpc_service.proto imports model_config.proto: the dependency must be in the same pool.
POOL.AddSerializedFile(model_config_pb2.DESCRIPTOR.serialized_pb)
