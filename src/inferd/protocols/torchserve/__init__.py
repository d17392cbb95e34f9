"""TorchServe's APIs: the inference and management HTTP routes, the two gRPC services,
and their generated messages."""
