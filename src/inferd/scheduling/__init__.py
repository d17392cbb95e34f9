"""Scheduling: how requests reach execution instances (direct, batched)."""
