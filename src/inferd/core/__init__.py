"""The request core: one request/response type, the error tree and datatype table, validation,
the registry of loaded versions with their routing and statistics, and the protocol-neutral data
plane (KServe v2 and TF Serving semantics) that every frontend calls. Knows no wire format."""
