"""MPPI planning in TD-MPC's latent space, batched over every env at once.

One planning call for B envs evaluates B x (num_samples + num_pi_trajs) action sequences in a single batched
latent rollout in its first iteration, and the B x num_samples new samples in each later one (the policy
trajectories are the same in every iteration, so their values are kept); there is no Python loop over envs in
the computation.

Noise and batch independence: every env slot b owns a `torch.Generator` (seeded `seed_b`), or is handed one
per call (its episode's stream, during evaluation), and all the random numbers a planning call needs for that
env (sampling noise of every iteration, policy-trajectory noise, the elite draw and the exploration noise) are
drawn from that generator alone, in a fixed order. So the plan env b gets depends only on its own
observation, its own previous plan and its own seed: planning B envs together gives each env what planning it
alone with the same seed would. Bit for bit when num_samples and N = num_samples + num_pi_trajs are multiples
of `ROW_ALIGN` and num_samples is at least `MIN_BLOCK_ROWS`; otherwise up to float rounding, since a row's
place in the batch can decide whether a kernel treats it in its vectorised part or its scalar tail. Drawing
the noise is the only per-env loop (B small `randn` calls per planning call).

Warm start: each slot keeps its last mean action sequence; the next call starts from it shifted by one
step (as TD-MPC). `reset(env_ids)` forgets it for envs that start a new episode.

Schedules: `set_schedule(horizon, std_floor)` shortens the horizon and raises the floor of the sampling std
(TD-MPC's warm-up, driven by `TDMPCPolicy.set_progress`); a changed horizon forgets every previous plan.

Speed (CPU): on one thread the value rollout of the B x N candidate sequences runs in blocks of about
`ROWS_PER_BLOCK` rows, so that each block's activations (rows x mlp_dim floats, n_q times that in the Q
ensemble) stay in cache instead of streaming tens of MB through memory; on several threads it runs as one
block (every op is then a parallel region, and many small ones cost more in thread wake-ups than the cache
saves), and on a GPU too (more, smaller kernels would only add launches). The hidden ELUs and the Q
ensemble's LayerNorm affine run in place, and the reward head and the dynamics read one [z_t, a_t] buffer.
Every row goes through the same ops as in one big batch, and block sizes are multiples of `ROW_ALIGN` rows,
so the kernels see the same element layout: the values, hence the plans, are bit-identical to evaluating all
rows at once (tests/test_tdmpc.py, benchmarks/bench_tdmpc_eval.py).
The cost left is arithmetic: with the CPU recipe's sizes, 1.40M multiply-adds per candidate sequence (5
steps of the reward and dynamics MLPs, then pi and the Q ensemble) and 8k ELUs (from `exp`, not the several
times slower `expm1`: `networks.elu_`); see docs/tdmpc.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from einops import einsum, rearrange
from torch import Tensor

from lerobot.policies.tdmpc.networks import WorldModel, mlp_inference

# Candidate rows (env x sequence) per block of the value rollout on one thread: a block's activations stay in
# the CPU's caches, which all rows at once do not (block sizes are compared by
# `benchmarks/bench_tdmpc_eval.py --sweep`, docs/benchmarks.md).
ROWS_PER_BLOCK = 512
# Block sizes are multiples of this many rows: every vectorised elementwise op and reduction then has its
# full-vector / scalar-tail split at the same rows as over all rows at once (AVX-512 kernels step 32 floats).
ROW_ALIGN = 32
# Blocks are at least this many rows: matmul kernels round a row's dot products the same way for any row
# count from here on (very short matrices take other code paths).
MIN_BLOCK_ROWS = 64


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
    plan_action: str
    pessimism: float


class MPPIPlanner:
    """Stateful MPPI planner: per-env previous plan and per-env random generators (not a module: no weights)."""

    def __init__(self, settings: PlannerSettings, action_dim: int, seed: int = 0):
        self.s = settings
        self.full_horizon = settings.horizon
        self.action_dim = action_dim
        self._base_seed = seed
        self._explicit_seeds: list[int] | None = None
        self._generators: list[torch.Generator] = []
        self._prev_mean: Tensor | None = None  # (B, H, A) last mean plan per env slot
        self._has_prev: Tensor | None = None  # (B,) bool
        self.std_floor = settings.min_std  # the sampling std's floor (above min_std during a schedule)

    def set_schedule(self, horizon: int, std_floor: float) -> None:
        """Plan `horizon` steps ahead (at most the configured horizon) with the sampling std floored at
        `std_floor`; a new horizon forgets the previous plans (their length no longer fits)."""
        if not 1 <= horizon <= self.full_horizon:
            raise ValueError(f"planning horizon {horizon} outside [1, {self.full_horizon}]")
        if horizon != self.s.horizon:
            self.s = replace(self.s, horizon=horizon)
            if self._prev_mean is not None:
                batch_size, _, a_dim = self._prev_mean.shape
                self._prev_mean = self._prev_mean.new_zeros(batch_size, horizon, a_dim)
                self._has_prev.zero_()
        self.std_floor = std_floor

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

    def _draw_noise(
        self, env_ids: Tensor, device: torch.device, generators: Sequence[torch.Generator] | None
    ) -> tuple[Tensor, Tensor]:
        """Per-env Gaussian (B, n_gauss) and uniform (B, num_elites) numbers, each row from its own generator:
        `generators[row]` when given, else the slot's own."""
        s, a_dim = self.s, self.action_dim
        n_gauss = (s.iterations * s.num_samples + s.num_pi_trajs + 1) * s.horizon * a_dim
        if generators is None:
            generators = [self._generators[b] for b in env_ids.tolist()]
        gauss, unif = [], []
        for g in generators:  # drawn on each generator's device (a CPU stream may serve a CUDA plan)
            gauss.append(torch.randn(n_gauss, generator=g, device=g.device))
            unif.append(torch.rand(s.num_elites, generator=g, device=g.device))
        return torch.stack(gauss).to(device), torch.stack(unif).to(device)

    # ----------------------------------------------------------------- planning
    @torch.no_grad()
    def plan(
        self,
        model: WorldModel,
        z: Tensor,
        explore: bool = False,
        env_ids: Tensor | None = None,
        generators: Sequence[torch.Generator] | None = None,
    ) -> Tensor:
        """Plan action sequences (B, H, A) in [-1, 1] from latents z (B, L).

        Args:
            model: the world model (dynamics, reward, Q, pi).
            z: encoded current observations, one row per env being planned for.
            explore: add the final std times Gaussian noise to the first action (data collection).
            env_ids: which env slots the rows of z are (a subset refill); None means rows 0..B-1 are all slots.
            generators: one per row of z, drawing that row's noise instead of its slot's generator (the
                episode streams of `Policy.noise_generators`).
        """
        s, device = self.s, z.device
        batch_size = z.shape[0]
        if env_ids is None:
            self._ensure_state(batch_size, device)
            env_ids = torch.arange(batch_size, device=device)
        elif self._prev_mean is None:
            raise ValueError("a planner subset call (env_ids) needs a previous full-batch call")
        env_ids = env_ids.to(device)

        gauss, unif = self._draw_noise(env_ids, device, generators)
        eps_samples, eps_pi, eps_explore = self._split_noise(gauss)
        pi_actions = self._policy_trajectories(model, z, eps_pi)
        # Warm start from the previous plan shifted by one step (its last step starts from 0).
        mean = torch.zeros(batch_size, s.horizon, self.action_dim, device=device)
        has_prev = self._has_prev[env_ids]
        shifted = torch.cat([self._prev_mean[env_ids, 1:], mean[:, :1]], dim=1)
        mean = torch.where(has_prev.view(-1, 1, 1), shifted, mean)
        std = torch.full_like(mean, s.max_std)
        mean, std, score, elite_actions = self._iterate(model, z, mean, std, eps_samples, pi_actions)

        if s.plan_action == "mean":
            plan = mean
        else:
            # One elite drawn by its score (Gumbel-max with this env's uniform numbers), as TD-MPC does.
            gumbel = -torch.log(-torch.log(unif.clamp(1e-20, 1 - 1e-7)))
            choice = (score.clamp_min(1e-30).log() + gumbel).argmax(dim=1)
            plan = elite_actions[torch.arange(batch_size, device=device), choice]  # (B, H, A)
        if explore:
            first = (plan[:, 0] + std[:, 0] * eps_explore[:, 0]).clamp(-1, 1)
            plan = torch.cat([first.unsqueeze(1), plan[:, 1:]], dim=1)

        self._prev_mean[env_ids] = mean
        self._has_prev[env_ids] = True
        return plan

    def _split_noise(self, gauss: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A planning call's Gaussian numbers (B, n_gauss) as `(sampling noise (B, iterations, num_samples, H,
        A), policy-trajectory noise (B, num_pi_trajs, H, A), exploration noise (B, H, A))`, in that order."""
        s, horizon, a_dim = self.s, self.s.horizon, self.action_dim
        n_iter_noise = s.iterations * s.num_samples * horizon * a_dim
        n_pi_noise = s.num_pi_trajs * horizon * a_dim
        eps_samples = rearrange(
            gauss[:, :n_iter_noise], "b (i n h a) -> b i n h a", i=s.iterations, n=s.num_samples, h=horizon
        )
        eps_pi = rearrange(
            gauss[:, n_iter_noise : n_iter_noise + n_pi_noise],
            "b (n h a) -> b n h a",
            n=s.num_pi_trajs,
            h=horizon,
        )
        eps_explore = rearrange(gauss[:, n_iter_noise + n_pi_noise :], "b (h a) -> b h a", h=horizon)
        return eps_samples, eps_pi, eps_explore

    def _policy_trajectories(self, model: WorldModel, z: Tensor, eps_pi: Tensor) -> Tensor:
        """Action sequences (B, num_pi_trajs, H, A) of the policy prior (with a little noise, `eps_pi`) along
        its own latent rollout from z (B, L): they seed the elites with good candidates."""
        s, horizon = self.s, self.s.horizon
        batch_size, n_pi = z.shape[0], s.num_pi_trajs
        pi_actions = z.new_zeros(batch_size, n_pi, horizon, self.action_dim)
        if n_pi > 0:
            zp = z.unsqueeze(1).expand(batch_size, n_pi, z.shape[-1])
            for t in range(horizon):
                pi_actions[:, :, t] = model.pi_noisy(zp, eps_pi[:, :, t], s.min_std)
                if t < horizon - 1:
                    zp = model.next(zp, pi_actions[:, :, t])
        return pi_actions

    def _iterate(
        self, model: WorldModel, z: Tensor, mean: Tensor, std: Tensor, eps_samples: Tensor, pi_actions: Tensor
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """MPPI's iterations from the sampling distribution (`mean`, `std`, each (B, H, A)): sample around it,
        value every candidate, refit it to the elites. Returns the final `(mean, std, score (B, K),
        elite_actions (B, K, H, A))` (score and elites None without iterations)."""
        s, batch_size, n_s = self.s, z.shape[0], self.s.num_samples
        z_rows = z.repeat_interleave(
            n_s + s.num_pi_trajs, dim=0
        )  # (B * N, L): row b * N + n is env b's latent
        z_sampled_rows = z.repeat_interleave(n_s, dim=0)  # (B * num_samples, L)
        pi_value = None  # (B, num_pi_trajs): the policy trajectories' values, the same in every iteration
        score = elite_actions = None
        for i in range(s.iterations):
            sampled = (mean.unsqueeze(1) + std.unsqueeze(1) * eps_samples[:, i]).clamp(-1, 1)
            actions = torch.cat([sampled, pi_actions], dim=1)  # (B, N, H, A); values below (B, N)
            if pi_value is None:
                # Both kinds of candidates in one rollout, so the first iteration's rows are laid out as
                # in every earlier planner (a batch of B * num_pi_trajs rows alone would take other kernels).
                value = self.estimate_value(model, z_rows, actions.flatten(0, 1)).view(batch_size, -1)
                pi_value = value[:, n_s:]
            else:
                sampled_value = self.estimate_value(model, z_sampled_rows, sampled.flatten(0, 1))
                value = torch.cat([sampled_value.view(batch_size, n_s), pi_value], dim=1)
            mean, std, score, elite_actions = self._refit(mean, value, actions)
        return mean, std, score, elite_actions

    def _refit(self, mean: Tensor, value: Tensor, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One refit to the elites: the `num_elites` best of the candidates `actions` (B, N, H, A) by `value`
        (B, N), weighted by MPPI's softmax. Returns `(mean, std, score (B, K), elite_actions (B, K, H, A))`,
        the mean moved from `mean` with the momentum."""
        s, n_el = self.s, self.s.num_elites
        elite_value, elite_idx = value.topk(n_el, dim=1)  # (B, K)
        elite_actions = actions.gather(
            1, elite_idx.view(value.shape[0], n_el, 1, 1).expand(-1, -1, *actions.shape[2:])
        )
        # Exponentiated, max-subtracted returns: MPPI's softmax weights over the elites.
        score = torch.softmax(s.temperature * elite_value, dim=1)  # (B, K)
        new_mean = einsum(score, elite_actions, "b k, b k h a -> b h a")
        var = einsum(score, (elite_actions - new_mean.unsqueeze(1)) ** 2, "b k, b k h a -> b h a")
        std = var.sqrt().clamp(self.std_floor, s.max_std)
        return s.momentum * mean + (1 - s.momentum) * new_mean, std, score, elite_actions

    def estimate_value(self, model: WorldModel, z: Tensor, actions: Tensor) -> Tensor:
        """Discounted predicted rewards over the horizon plus the discounted terminal Q: the ensemble mean,
        less `pessimism` times the members' standard deviation when that is set.

        z: (R, L) start latents, actions: (R, H, A) -> (R,), one row per candidate sequence. The whole
        ensemble (not a random subset) keeps the planner deterministic given its noise. Rows are independent;
        they are evaluated in blocks (see `block_bounds`) to keep the activations in cache.
        """
        n_rows = actions.shape[0]
        blocked = z.device.type == "cpu" and torch.get_num_threads() == 1
        rows_per_block = ROWS_PER_BLOCK if blocked else n_rows
        values = torch.empty(n_rows, device=z.device)
        for start, stop in block_bounds(n_rows, rows_per_block):
            values[start:stop] = self._block_value(model, z[start:stop], actions[start:stop])
        return values

    def _block_value(self, model: WorldModel, z: Tensor, actions: Tensor) -> Tensor:
        """`estimate_value` of one block of rows: z (r, L), actions (r, H, A) -> (r,).

        The same ops as `WorldModel.reward/next/pi/q` (bit-identical), with one (r, L + A) input buffer
        holding [z_t, a_t] for both the reward head and the dynamics instead of two concatenations.
        """
        latent_dim = z.shape[1]
        za = torch.empty(z.shape[0], latent_dim + actions.shape[2], device=z.device)  # [z_t, a_t]
        za[:, :latent_dim] = z
        value = torch.zeros(z.shape[0], device=z.device)
        discount = 1.0
        for t in range(actions.shape[1]):
            za[:, latent_dim:] = actions[:, t]
            value += discount * model.to_scalar(mlp_inference(model.reward_head, za))
            z = mlp_inference(model.dynamics, za)  # (r, L)
            za[:, :latent_dim] = z
            discount *= self.s.discount
        za[:, latent_dim:] = model.prior_mean(mlp_inference(model.pi_head, z))
        q = model.to_scalar(model.q_ensemble.forward_inference(za))  # (n_q, r)
        terminal = q.mean(dim=0)
        if self.s.pessimism > 0:
            terminal = terminal - self.s.pessimism * q.std(dim=0)
        return value + discount * terminal


def block_bounds(n_rows: int, rows_per_block: int) -> list[tuple[int, int]]:
    """(start, stop) of the row blocks `estimate_value` evaluates: about `rows_per_block` rows each, sizes
    multiples of `ROW_ALIGN` but the last, none shorter than `MIN_BLOCK_ROWS` (one block if n_rows is small)."""
    n_blocks = max(1, round(n_rows / rows_per_block))
    size = -(-n_rows // n_blocks)  # ceil
    size = -(-size // ROW_ALIGN) * ROW_ALIGN
    starts = list(range(0, n_rows, size))
    if len(starts) > 1 and n_rows - starts[-1] < MIN_BLOCK_ROWS:
        starts.pop()  # a short last block joins the one before it
    return list(zip(starts, [*starts[1:], n_rows]))
