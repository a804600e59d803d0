"""SAC: Soft Actor-Critic with automatic entropy tuning (Haarnoja et al. 2018), from state or pixels (DrQ)."""

from lerobot.policies.sac.configuration import SACConfig
from lerobot.policies.sac.modeling import SACPolicy

__all__ = ["SACConfig", "SACPolicy"]
