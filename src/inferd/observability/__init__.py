"""Observability: Prometheus metrics, engine and access logs, tracing."""
