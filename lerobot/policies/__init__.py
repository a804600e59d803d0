"""Policies: the shared `Policy` base class (`lerobot.policies.policy`), baselines and learned policies.

The registry (`factory`), the configs and the normalization below the base class sit in this package too; the
base class loads saved policies through `lerobot.checkpoints`, which builds them through the registry. So this
package's face imports nothing at import time, and `Policy` is loaded when first asked for.
"""

from typing import Any

__all__ = ["Policy"]


def __getattr__(name: str) -> Any:
    if name == "Policy":
        from lerobot.policies.policy import Policy

        return Policy
    raise AttributeError(f"module 'lerobot.policies' has no attribute {name!r}")
