"""The application: Settings from flags and environment, the assembly of one server from them,
graceful drain, and the command-line tools beside ``serve`` (repo, envoy-config)."""
