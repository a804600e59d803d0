"""Where two resolved configs differ, leaf by leaf (a resumed run's config against its checkpoint's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def config_differences(
    a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, prefix: str = ""
) -> list[tuple[str, Any, Any]]:
    """`(dotted key, value in a, value in b)` for every leaf where two nested dicts (resolved configs)
    differ, sorted by key, each key starting with `prefix`; lists are leaves (compared whole), and a section
    that only one side has differs leaf by leaf (the other side's value is None)."""
    flat_a, flat_b = _flatten(a or {}, prefix), _flatten(b or {}, prefix)
    keys = sorted(flat_a.keys() | flat_b.keys())
    return [(k, flat_a.get(k), flat_b.get(k)) for k in keys if flat_a.get(k) != flat_b.get(k)]


def _flatten(node: Any, prefix: str) -> dict[str, Any]:
    """Nested dicts as `{prefix + dotted.key: leaf}`; an empty dict is a leaf."""
    if not isinstance(node, Mapping):
        return {prefix: node}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flatten(v, f"{prefix}{k}." if isinstance(v, Mapping) and v else f"{prefix}{k}"))
    return out
