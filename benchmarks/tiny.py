"""The tests' tiny settings (Hydra overrides), kept in one place for the tests and the benchmarks that run
the same small models.

The tests import them the way they import the other benchmark modules (`benchmarks/` put on `sys.path`);
the benchmarks run as scripts from `benchmarks/`. They live here rather than in the `lerobot` package, which
should not carry test settings, or in `tests/`, which the benchmarks do not import.
"""

from __future__ import annotations

# Models small enough for a 2-core CPU.
TINY_DIFFUSION = ["policy.down_dims=[16,32]", "policy.diffusion_step_embed_dim=8", "policy.n_groups=4"]
TINY_TDMPC = ["policy.latent_dim=16", "policy.enc_dim=32", "policy.mlp_dim=32", "policy.n_q=2"]
# TD-MPC's planner cut down: 3 steps ahead, 2 iterations of 16 samples, 4 elites, 2 policy trajectories.
TINY_PLANNER = [
    "policy.horizon=3",
    "policy.iterations=2",
    "policy.num_samples=16",
    "policy.num_elites=4",
    "policy.num_pi_trajs=2",
]
TINY_ACT = [
    "policy.dim_model=16",
    "policy.n_heads=2",
    "policy.dim_feedforward=32",
    "policy.n_encoder_layers=1",
    "policy.n_vae_encoder_layers=1",
    "policy.latent_dim=4",
    "policy.chunk_size=6",
    "policy.n_action_steps=3",
]
# An 8x8 camera keeps an image model tiny (gym-pusht renders observations at any size).
PUSHT_8PX = [
    "env.gym_kwargs.observation_width=8",
    "env.gym_kwargs.observation_height=8",
    "env.features={observation.image: {shape: [3, 8, 8]}}",
]
# A tiny TD-MPC on Pendulum with a tiny planner, 2 envs, a checkpoint and an evaluation every 20 transitions.
TDMPC_PENDULUM = [
    "policy=tdmpc",
    "env=pendulum",
    "env.max_episode_steps=12",
    *TINY_TDMPC,
    *TINY_PLANNER,
    "training.batch_size=8",
    "training.n_envs=2",
    "training.learning_starts=10",
    "training.gradient_steps=-1",
    "training.log_freq=10",
    "training.save_freq=20",
    "eval.freq=20",
    "eval.n_episodes=2",
    "eval.batch_size=2",
    "eval.max_episodes_rendered=0",
    "eval.use_async_envs=false",
]
