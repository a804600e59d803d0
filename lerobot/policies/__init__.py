"""Policies: the shared `Policy` base class, baselines and learned policies."""

from lerobot.policies.policy import Policy

__all__ = ["Policy"]
