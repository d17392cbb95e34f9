"""The transport every API rides on: the RSGI HTTP app and its routes, bodies and
listeners, and the gRPC servers (the native HTTP/2 one in ``h2grpc``, grpcio's) with the
services they serve."""
