"""Core model configuration: the ModelConfig message (Triton's field numbers) and the typed
ModelSpec the request path checks against. Backends, scheduling and protocols import from here;
``inferd.repository`` only reads and writes the files that hold configs."""
