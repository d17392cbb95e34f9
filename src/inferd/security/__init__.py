"""Security at the edge: API tokens and scopes, the operator's code-trust policy, the HTTP and
gRPC guards that enforce them, TLS, client address policy and redaction of server paths."""
