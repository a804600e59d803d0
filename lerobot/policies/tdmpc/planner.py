"""MPPI planning in TD-MPC's latent space, batched over every env at once.

One planning call for B envs evaluates B x (num_samples + num_pi_trajs) action sequences in a single batched
latent rollout per iteration; there is no Python loop over envs in the computation.

Noise and batch independence: every env slot b owns a `torch.Generator` (seeded `seed_b`), and all the random
numbers a planning call needs for that env (sampling noise of every iteration, policy-trajectory noise,
the elite draw and the exploration noise) are drawn from that generator alone, in a fixed order. So the plan
env b gets depends only on its own observation, its own previous plan and its own seed: planning B envs
together gives each env what planning it alone with the same seed would (up to float rounding of batched
matmuls). Drawing the noise is the only per-env loop (B small `randn` calls per planning call).

Warm start: each slot keeps its last mean action sequence; the next call starts from it shifted by one
step (as TD-MPC). `reset(env_ids)` forgets it for envs that start a new episode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from einops import einsum, rearrange
from torch import Tensor

from lerobot.policies.tdmpc.networks import WorldModel


@dataclass
class PlannerSettings:
    """MPPI hyper-parameters (see `TDMPCConfig` for their meaning and defaults)."""

    horizon: int
    iterations: int
    num_samples: int
    num_elites: int
    num_pi_trajs: int
    temperature: float
    momentum: float
    min_std: float
    max_std: float
    discount: float


class MPPIPlanner:
    """Stateful MPPI planner: per-env previous plan and per-env random generators (not a module: no weights)."""

    def __init__(self, settings: PlannerSettings, action_dim: int, seed: int = 0):
        self.s = settings
        self.action_dim = action_dim
        self._base_seed = seed
        self._explicit_seeds: list[int] | None = None
        self._generators: list[torch.Generator] = []
        self._prev_mean: Tensor | None = None  # (B, H, A) last mean plan per env slot
        self._has_prev: Tensor | None = None  # (B,) bool

    # ----------------------------------------------------------------- per-env state
    def set_seed(self, seed: int | Sequence[int]) -> None:
        """Seed the planner noise: an int gives slot b the seed `seed + b`; a sequence gives one seed per slot.

        Also forgets previous plans, so the next call is reproducible from the seed alone.
        """
        if isinstance(seed, int):
            self._base_seed, self._explicit_seeds = seed, None
        else:
            self._explicit_seeds = [int(s) for s in seed]
        self._generators = []
        self._prev_mean = self._has_prev = None

    def reset(self, env_ids: Tensor | None = None) -> None:
        """Forget the previous plan of `env_ids` (all envs and reseed the generators when None)."""
        if env_ids is None:
            self._generators = []
            self._prev_mean = self._has_prev = None
        elif self._has_prev is not None:
            self._has_prev[env_ids.to(self._has_prev.device)] = False

    def _ensure_state(self, batch_size: int, device: torch.device) -> None:
        if len(self._generators) == batch_size and self._prev_mean is not None:
            if self._prev_mean.device != device:
                self._prev_mean, self._has_prev = self._prev_mean.to(device), self._has_prev.to(device)
            return
        if self._explicit_seeds is not None:
            if len(self._explicit_seeds) != batch_size:
                raise ValueError(
                    f"planner seeded for {len(self._explicit_seeds)} envs, asked to plan {batch_size}"
                )
            seeds = self._explicit_seeds
        else:
            seeds = [self._base_seed + b for b in range(batch_size)]
        self._generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self._prev_mean = torch.zeros(batch_size, self.s.horizon, self.action_dim, device=device)
        self._has_prev = torch.zeros(batch_size, dtype=torch.bool, device=device)

    def _draw_noise(self, env_ids: Tensor, device: torch.device) -> tuple[Tensor, Tensor]:
        """Per-env Gaussian (B, n_gauss) and uniform (B, num_elites) numbers, each env from its own generator."""
        s, a_dim = self.s, self.action_dim
        n_gauss = (s.iterations * s.num_samples + s.num_pi_trajs + 1) * s.horizon * a_dim
        gauss, unif = [], []
        for b in env_ids.tolist():
            g = self._generators[b]
            gauss.append(torch.randn(n_gauss, generator=g, device=device))
            unif.append(torch.rand(s.num_elites, generator=g, device=device))
        return torch.stack(gauss), torch.stack(unif)

    # ----------------------------------------------------------------- planning
    @torch.no_grad()
    def plan(
        self, model: WorldModel, z: Tensor, explore: bool = False, env_ids: Tensor | None = None
    ) -> Tensor:
        """Plan action sequences (B, H, A) in [-1, 1] from latents z (B, L).

        Args:
            model: the world model (dynamics, reward, Q, pi).
            z: encoded current observations, one row per env being planned for.
            explore: add the final std times Gaussian noise to the first action (data collection).
            env_ids: which env slots the rows of z are (a subset refill); None means rows 0..B-1 are all slots.
        """
        s, device = self.s, z.device
        batch_size = z.shape[0]
        if env_ids is None:
            self._ensure_state(batch_size, device)
            env_ids = torch.arange(batch_size, device=device)
        elif self._prev_mean is None:
            raise ValueError("a planner subset call (env_ids) needs a previous full-batch call")
        env_ids = env_ids.to(device)
        n_s, n_pi, n_el, horizon, a_dim = (
            s.num_samples,
            s.num_pi_trajs,
            s.num_elites,
            s.horizon,
            self.action_dim,
        )

        gauss, unif = self._draw_noise(env_ids, device)
        n_iter_noise = s.iterations * n_s * horizon * a_dim
        n_pi_noise = n_pi * horizon * a_dim
        eps_samples = rearrange(
            gauss[:, :n_iter_noise], "b (i n h a) -> b i n h a", i=s.iterations, n=n_s, h=horizon
        )
        eps_pi = rearrange(
            gauss[:, n_iter_noise : n_iter_noise + n_pi_noise], "b (n h a) -> b n h a", n=n_pi, h=horizon
        )
        eps_explore = rearrange(gauss[:, n_iter_noise + n_pi_noise :], "b (h a) -> b h a", h=horizon)

        # Trajectories of the policy prior (with a little noise) seed the elites with good candidates.
        pi_actions = z.new_zeros(batch_size, n_pi, horizon, a_dim)
        if n_pi > 0:
            zp = z.unsqueeze(1).expand(batch_size, n_pi, z.shape[-1])
            for t in range(horizon):
                pi_actions[:, :, t] = (model.pi(zp) + s.min_std * eps_pi[:, :, t]).clamp(-1, 1)
                if t < horizon - 1:
                    zp = model.next(zp, pi_actions[:, :, t])

        # Warm start from the previous plan shifted by one step (its last step starts from 0).
        mean = torch.zeros(batch_size, horizon, a_dim, device=device)
        has_prev = self._has_prev[env_ids]
        shifted = torch.cat([self._prev_mean[env_ids, 1:], mean[:, :1]], dim=1)
        mean = torch.where(has_prev.view(-1, 1, 1), shifted, mean)
        std = torch.full_like(mean, s.max_std)

        z_all = z.unsqueeze(1).expand(batch_size, n_s + n_pi, z.shape[-1])
        for i in range(s.iterations):
            sampled = (mean.unsqueeze(1) + std.unsqueeze(1) * eps_samples[:, i]).clamp(-1, 1)
            actions = torch.cat([sampled, pi_actions], dim=1)  # (B, N, H, A)
            value = self.estimate_value(model, z_all, actions)  # (B, N)
            elite_value, elite_idx = value.topk(n_el, dim=1)  # (B, K)
            elite_actions = actions.gather(
                1, elite_idx.view(batch_size, n_el, 1, 1).expand(-1, -1, horizon, a_dim)
            )
            # Exponentiated, max-subtracted returns: MPPI's softmax weights over the elites.
            score = torch.softmax(s.temperature * elite_value, dim=1)  # (B, K)
            new_mean = einsum(score, elite_actions, "b k, b k h a -> b h a")
            var = einsum(score, (elite_actions - new_mean.unsqueeze(1)) ** 2, "b k, b k h a -> b h a")
            std = var.sqrt().clamp(s.min_std, s.max_std)
            mean = s.momentum * mean + (1 - s.momentum) * new_mean

        # Execute one elite drawn by its score (Gumbel-max with this env's uniform numbers), as TD-MPC does.
        gumbel = -torch.log(-torch.log(unif.clamp(1e-20, 1 - 1e-7)))
        choice = (score.clamp_min(1e-30).log() + gumbel).argmax(dim=1)
        plan = elite_actions[torch.arange(batch_size, device=device), choice]  # (B, H, A)
        if explore:
            first = (plan[:, 0] + std[:, 0] * eps_explore[:, 0]).clamp(-1, 1)
            plan = torch.cat([first.unsqueeze(1), plan[:, 1:]], dim=1)

        self._prev_mean[env_ids] = mean
        self._has_prev[env_ids] = True
        return plan

    def estimate_value(self, model: WorldModel, z: Tensor, actions: Tensor) -> Tensor:
        """Discounted predicted rewards over the horizon plus the discounted terminal Q (ensemble mean).

        z: (B, N, L), actions: (B, N, H, A) -> (B, N). The ensemble mean (not a random subset) keeps the
        planner deterministic given its noise.
        """
        value = torch.zeros(actions.shape[:2], device=z.device)
        discount = 1.0
        for t in range(actions.shape[2]):
            a = actions[:, :, t]
            value = value + discount * model.reward(z, a)
            z = model.next(z, a)
            discount *= self.s.discount
        return value + discount * model.q(z, model.pi(z)).mean(dim=0)
