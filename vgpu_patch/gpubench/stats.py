"""How a measurement repeated over rounds is summed up: its median and its spread (min-max)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    median: float
    min: float
    max: float

    @classmethod
    def of(cls, xs: list[float]) -> Spread:
        return cls(statistics.median(xs), min(xs), max(xs))

    def text(self, fmt: str = ".3f") -> str:
        """`median (min-max)`; the median alone when every round gave the same"""
        if self.min == self.max:
            return f"{self.median:{fmt}}"
        return f"{self.median:{fmt}} ({self.min:{fmt}}-{self.max:{fmt}})"

    def to_json(self) -> dict[str, float]:
        return {"median": self.median, "min": self.min, "max": self.max}


def spread_text(xs: list[float], fmt: str = ".3f") -> str:
    return Spread.of(xs).text(fmt)
