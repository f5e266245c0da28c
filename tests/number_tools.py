"""Tools whose arguments or results are where bad numbers hide: untyped and
float parameters, and results that are not plain JSON."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from saga_store import Reversibility, tool

__all__ = ["Deep", "deep", "keep", "measure", "returns_deep_model", "returns_huge",
           "returns_nan"]


def deep(levels: int) -> list[Any]:
    """A list nested ``levels`` deep, built without recursion."""
    top: list[Any] = []
    inner = top
    for _ in range(levels - 1):
        inner.append([])
        inner = inner[0]
    return top


class Deep(BaseModel):
    value: Any = None


@tool(reversibility=Reversibility.READONLY)
def keep(value: Any = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Answer with what it was given (an untyped parameter, and an untyped dict)."""
    return {"value": value, "extra": extra}


@tool(reversibility=Reversibility.READONLY)
def measure(ratio: float) -> dict[str, Any]:
    """A float parameter: pydantic reads the string "inf" as infinity."""
    return {"ratio": ratio}


@tool(reversibility=Reversibility.READONLY)
def returns_nan() -> dict[str, Any]:
    return {"score": float("nan")}


@tool(reversibility=Reversibility.READONLY)
def returns_huge() -> dict[str, Any]:
    return {"id": 2**64}


@tool(reversibility=Reversibility.READONLY)
def returns_deep_model() -> Deep:
    return Deep(value=deep(300))
