"""Protocol adapters: wire formats in, InferRequest/InferResponse through the data plane."""
