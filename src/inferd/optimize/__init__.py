"""``inferd optimize``: an optimized copy of a model (graph optimizations, INT8, FP16) written as
a new version beside the original, after an accuracy check against it."""
