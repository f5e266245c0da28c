"""Tools for the tests of what 'saga run --wait' says while it waits."""

from __future__ import annotations

from typing import Any

from saga_store import Reversibility, tool


@tool(reversibility=Reversibility.READONLY)
def look_up(sku: str) -> dict[str, Any]:
    return {"sku": sku}


@tool(reversibility=Reversibility.IRREVERSIBLE, approval="require_approval")
def ship(sku: str) -> dict[str, Any]:
    return {"shipped": sku}


@tool
def unreserve(sku: str) -> dict[str, Any]:
    raise RuntimeError("the warehouse is offline")


@tool(compensation=unreserve, mapping={"sku": "$.input.sku"})
def reserve(sku: str) -> dict[str, Any]:
    return {"reserved": sku}


@tool(reversibility=Reversibility.READONLY)
def refuse(why: str) -> dict[str, Any]:
    raise ValueError(why)
