"""TD-MPC: model-based RL that plans with MPPI in a learned latent space (Hansen et al. 2022)."""

from lerobot.policies.tdmpc.configuration import TDMPCConfig
from lerobot.policies.tdmpc.modeling import TDMPCPolicy

__all__ = ["TDMPCConfig", "TDMPCPolicy"]
