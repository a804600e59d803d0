"""Diffusion Policy (Chi et al. 2023): configuration, U-Net, vision encoder and the policy."""
