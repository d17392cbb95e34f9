"""KServe v2 / Triton: its HTTP routes and gRPC service, their codecs, and Triton's extensions
(repository, trace and log settings, shared memory, generate)."""
