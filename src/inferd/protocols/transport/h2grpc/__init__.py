"""A native gRPC server: HTTP/2 from libnghttp2 (ctypes), calls on the asyncio loop."""
