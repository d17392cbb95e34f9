"""The request plane: a loaded version (model, with validation and classification), the
registry of versions with their routing and shadows, loading on first use as the plane sees it
(demand), the registered shared-memory regions, TF Serving's predict/classify/regress, and the
protocol-neutral data plane (KServe v2 and TF Serving semantics) that every frontend calls.
Above scheduling, below the repository that fills it; knows no wire format."""
