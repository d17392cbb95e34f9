"""``ts.metrics.dimension``: a metric's dimension, a (name, value) pair."""

from __future__ import annotations


class Dimension:
    def __init__(self, name: str, value: str) -> None:
        self.name = name
        self.value = value

    def __str__(self) -> str:
        return f"{self.name}:{self.value}"

    def to_dict(self) -> dict[str, str]:
        return {"Name": self.name, "Value": self.value}
