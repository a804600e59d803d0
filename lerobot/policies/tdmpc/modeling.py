"""`TDMPCPolicy`: TD-MPC's world model, its losses, and acting by MPPI planning through the `Policy` base class.

Acting path: `select_action` (base class) -> `predict_action_chunk`: encode the current observation, plan
B envs at once with `MPPIPlanner`, return the planned actions (B, H, A) in env units.

Learning path: the online trainer samples sub-trajectories from the replay buffer and calls `forward`:

    batch[obs key]            (B, H+1, D)  observations o_0 .. o_H (o_{t+1} is the next obs of step t)
    batch["action"]           (B, H, A)    actions a_0 .. a_{H-1}, env units
    batch["next.reward"]      (B, H)       r_t
    batch["next.terminated"]  (B, H)       1 where step t ended the episode by termination (no bootstrap)

then, after the optimiser step, `update_target()` moves the EMA target network towards the online one.
`TDMPCPolicy` implements the `OnlinePolicy` contract the online trainer relies on.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from lerobot.constants import (
    ACTION,
    FROM_DEMONSTRATIONS,
    NEXT_REWARD,
    NEXT_TERMINATED,
    SAMPLE_PRIORITY,
    SAMPLE_WEIGHT,
)
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.policies.policy import acting_settings
from lerobot.policies.tdmpc.configuration import TDMPCConfig
from lerobot.policies.tdmpc.networks import BoundsNormalizer, WorldModel
from lerobot.policies.tdmpc.planner import MPPIPlanner, PlannerSettings


class TDMPCPolicy(OnlinePolicy):
    """TD-MPC: plans with MPPI in a learned latent space, learns from replayed sub-trajectories.

    `dataset_stats` is accepted for the factory's signature and ignored: normalisation comes from the
    features' `low`/`high` bounds, which online RL knows before it has seen any data.

    As an `OnlinePolicy`: `replay_horizon` is `config.horizon`, `update_target()` is an EMA step of the
    target network, `set_noise_seed()` seeds the per-env planner noise, `explore` adds the planner's
    final std as noise to the first planned action, and it reports priorities (its TD errors).
    """

    reports_priorities = True

    def __init__(self, config: TDMPCConfig, dataset_stats: dict | None = None):
        super().__init__(**acting_settings(config))
        config.validate()
        self.config = config
        self.obs_keys = sorted(config.input_features)
        (self.action_key,) = config.output_features
        self.obs_dim = sum(math.prod(config.input_features[k].shape) for k in self.obs_keys)
        self.action_dim = config.action_dim
        self.normalizer = BoundsNormalizer({**config.input_features, **config.output_features})
        self.model = WorldModel(
            obs_dim=self.obs_dim,
            action_dim=self.action_dim,
            latent_dim=config.latent_dim,
            enc_dim=config.enc_dim,
            mlp_dim=config.mlp_dim,
            simnorm_dim=config.simnorm_dim,
            n_q=config.n_q,
            value_bins=config.value_bins,
            stochastic_prior=config.prior_entropy_coeff > 0,
            activation=config.activation,
            q_dropout=config.q_dropout,
        )
        # The target network is a frozen EMA copy of the whole model (encoder and Q are what the targets use).
        self.model_target = copy.deepcopy(self.model).requires_grad_(False).eval()
        # Running Q scale (`q_scale_stat`), dividing the policy objective so its gradient scale does not
        # depend on the task's reward scale.
        self.register_buffer("q_scale", torch.ones(()))
        self.planner = MPPIPlanner(
            PlannerSettings(
                horizon=config.planning_horizon,
                iterations=config.iterations,
                num_samples=config.num_samples,
                num_elites=config.num_elites,
                num_pi_trajs=config.num_pi_trajs,
                temperature=config.temperature,
                momentum=config.momentum,
                min_std=config.min_std,
                max_std=config.max_std,
                discount=config.discount,
                plan_action=config.plan_action,
                pessimism=config.plan_pessimism,
            ),
            action_dim=self.action_dim,
            seed=config.planner_seed,
        )

    def train(self, mode: bool = True) -> TDMPCPolicy:
        """Train or eval mode; the target network stays in eval mode, so TD targets never drop Q units (as
        TD-MPC2, which computes them in eval mode)."""
        super().train(mode)
        self.model_target.eval()
        return self

    def optimizer_param_groups(self) -> list[dict]:
        """One group at `optimizer_lr`, or with `encoder_lr_scale != 1` two: the encoder at that multiple of
        it (TD-MPC2: 0.3) and everything else."""
        scale = self.config.encoder_lr_scale
        if scale == 1.0:
            return super().optimizer_param_groups()
        encoder = [p for p in self.model.encoder.parameters() if p.requires_grad]
        encoder_ids = {id(p) for p in encoder}
        rest = [p for p in self.parameters() if p.requires_grad and id(p) not in encoder_ids]
        return [{"params": rest}, {"params": encoder, "lr": self.config.optimizer_lr * scale}]

    # ----------------------------------------------------------------- acting
    def on_reset(self, env_ids: Tensor | None) -> None:
        planner = getattr(self, "planner", None)  # the base __init__ resets before our attributes exist
        if planner is not None:
            planner.reset(env_ids)

    def set_noise_seed(self, seed: int | Sequence[int]) -> None:
        """Seed planner noise: an int gives env slot b `seed + b`; a sequence gives one seed per env slot."""
        self.planner.set_seed(seed)

    def set_progress(self, transitions: int) -> None:
        """TD-MPC's warm-up schedules (`schedule_steps`) at `transitions` collected: the planner's horizon
        and std floor, linear from (1, `std_schedule_start`) to (the planning horizon, `min_std`)."""
        cfg = self.config
        if cfg.schedule_steps <= 0:
            return
        frac = min(transitions / cfg.schedule_steps, 1.0)
        horizon = int((1 - frac) * 1 + frac * cfg.planning_horizon)
        std_floor = (1 - frac) * cfg.std_schedule_start + frac * cfg.min_std
        self.planner.set_schedule(horizon, std_floor)

    @property
    def replay_horizon(self) -> int:
        """Length H of the replayed sub-trajectories the losses are computed on."""
        return self.config.horizon

    def encode_observation(self, batch: dict[str, Tensor]) -> Tensor:
        """Normalised, flattened, concatenated observation features: (..., *shape) per key -> (..., obs_dim)."""
        parts = []
        for key in self.obs_keys:
            x = self.normalizer.normalize(key, batch[key])
            n_feat_dims = len(self.config.input_features[key].shape)
            parts.append(x.flatten(start_dim=x.ndim - n_feat_dims) if n_feat_dims else x.unsqueeze(-1))
        return torch.cat(parts, dim=-1)

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """Planned actions (B, H, A) in env units from observations (B, n_obs_steps=1, ...)."""
        obs = {k: batch[k][:, -1] for k in self.obs_keys}
        z = self.model.encode(self.encode_observation(obs))
        if self.config.use_mpc:
            actions = self.planner.plan(
                self.model, z, self.explore, self.chunk_env_ids, self.noise_generators()
            )
        else:
            actions = self._policy_rollout(z)
        return self.normalizer.unnormalize(self.action_key, actions)

    def _policy_rollout(self, z: Tensor) -> Tensor:
        """Actions of the policy prior along its own latent rollout (B, H, A); when exploring, with min_std
        noise (or drawn from the Gaussian prior)."""
        actions = []
        for t in range(self.config.planning_horizon):
            if self.explore:
                eps = torch.randn(*z.shape[:-1], self.action_dim, device=z.device)
                a = self.model.pi_noisy(z, eps, self.config.min_std)
            else:
                a = self.model.pi(z)
            actions.append(a)
            if t < self.config.planning_horizon - 1:
                z = self.model.next(z, a)
        return torch.stack(actions, dim=1)

    # ----------------------------------------------------------------- learning
    def _learning_reward(self, reward: Tensor) -> Tensor:
        """The reward the model and value learn from: the env's (B, H) reward raised to `reward_exponent`."""
        exponent = self.config.reward_exponent
        if exponent == 1.0:
            return reward
        if bool((reward < 0).any() | (reward > 1).any()):
            raise ValueError(
                f"policy.reward_exponent={exponent} needs rewards in [0, 1], got a batch spanning "
                f"[{reward.min().item():.3g}, {reward.max().item():.3g}]; use policy.reward_exponent=1 on this env"
            )
        return reward**exponent

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """TD-MPC losses on replayed sub-trajectories (see the module docstring for the batch layout).

        Each term is a sum over time steps t of rho**t times the per-step loss, divided by the horizon:
        - consistency: ||d(z_t, a_t) - h_target(o_{t+1})||^2 (latent rollout from z_0 = h(o_0))
        - reward: (R(z_t, a_t) - r_t)^2, where r_t is the env's reward raised to `reward_exponent`
          (with `value_bins`, here and in the value term: the cross-entropy of the head's bins against the
          target's two-hot encoding instead of the squared error)
        - value: sum over the ensemble of (Q_k(z_t, a_t) - (r_t + discount * (1 - term_t) * V'(o_{t+1})))^2,
          V'(o) = min over `n_q_min` random target Qs of Q'(h(o), pi(h(o))); with `absorbing_terminal` a
          terminated step bootstraps from r_t / (1 - discount) instead of nothing
        - policy: -min (or mean, `policy_q_reduction`) over `n_q_min` random Qs of Q(z_t, pi(z_t)) / q_scale
          on detached latents, Q frozen (q_scale: a running statistic of those values, `q_scale_stat`);
          with `prior_entropy_coeff > 0` the action is a draw from the Gaussian prior and the objective
          gains prior_entropy_coeff * action_dim * -log pi(a_t | z_t), the entropy's one-sample estimate;
          with `bc_coeff > 0` plus bc_coeff * (pi(z_t) - a_t)^2 (mean over action dims) on the rows marked
          `FROM_DEMONSTRATIONS`, t < H

        With prioritised replay the batch holds `sample_weight` (B,): the consistency, reward and value terms
        become weighted means over the batch (the policy term stays a plain mean, as in TD-MPC), and the
        output gains `sample_priority` (B,): sum over t of rho**t times sum over the ensemble of
        |Q_k(z_t, a_t) - td_target_t|, clamped at 1e4 (TD-MPC's priority).
        """
        cfg = self.config
        action = self.normalizer.normalize(self.action_key, batch[ACTION])  # (B, H, A)
        reward = self._learning_reward(batch[NEXT_REWARD].float())  # (B, H)
        terminated = batch.get(NEXT_TERMINATED, torch.zeros_like(reward)).float()
        horizon = action.shape[1]
        obs = self.encode_observation({k: batch[k] for k in self.obs_keys})  # (B, H+1, D)
        if obs.shape[1] != horizon + 1:
            raise ValueError(f"observations need H+1={horizon + 1} steps, got {obs.shape[1]}")
        rho = cfg.rho ** torch.arange(horizon + 1, device=action.device, dtype=action.dtype)  # (H+1,)
        z_target, td_target = self._targets(obs[:, 1:], reward, terminated)

        # Latent rollout through the learned dynamics (sequential), then reward and Q on all steps at once.
        zs = self._latent_rollout(obs[:, 0], action)  # (B, H+1, L)
        q_out = self.model.q_outputs(zs[:, :-1], action)  # (n_q, B, H, n_out)
        r_out = self.model.reward_outputs(zs[:, :-1], action)  # (B, H, n_out)

        w = rho[:horizon]
        sample_weight = batch.get(SAMPLE_WEIGHT)  # (B,) with prioritised replay

        def batch_mean(per_step: Tensor) -> Tensor:
            """The rho-discounted mean over time of (B, H) per-step losses, averaged over the batch."""
            per_sample = (w * per_step).sum(dim=1) / horizon
            return per_sample.mean() if sample_weight is None else (sample_weight * per_sample).mean()

        consistency = batch_mean(((zs[:, 1:] - z_target) ** 2).mean(dim=2))
        reward_loss = batch_mean(self.model.regression_loss(r_out, reward))  # regression loss (B, H)
        value_loss = batch_mean(self.model.regression_loss(q_out, td_target).sum(dim=0))  # (n_q, B, H)

        z_pi = zs.detach()
        policy_loss, pi_actions, extra = self._policy_loss(z_pi, rho)
        if sample_weight is not None:
            with torch.no_grad():
                td_error = (self.model.to_scalar(q_out) - td_target).abs().sum(dim=0)  # (B, H)
                extra[SAMPLE_PRIORITY] = (w * td_error).sum(dim=1).clamp(max=1e4)
        bc_loss = self._bc_loss(batch, action, z_pi, pi_actions, w)

        loss = (
            cfg.consistency_coeff * consistency
            + cfg.reward_coeff * reward_loss
            + cfg.value_coeff * value_loss
            + cfg.policy_coeff * policy_loss
            + cfg.bc_coeff * bc_loss
        )
        return {
            "loss": loss,
            "consistency_loss": consistency.detach(),
            "reward_loss": reward_loss.detach(),
            "value_loss": value_loss.detach(),
            "policy_loss": policy_loss.detach(),
            "bc_loss": bc_loss.detach(),
            "q_mean": self.model.to_scalar(q_out.detach()).mean(),
            "td_target_mean": td_target.mean(),
            **extra,
        }

    @torch.no_grad()
    def _targets(self, next_obs: Tensor, reward: Tensor, terminated: Tensor) -> tuple[Tensor, Tensor]:
        """`(z_target (B, H, L), td_target (B, H))` of the next observations `next_obs` (B, H, D): the target
        encoder's latents (the consistency targets) and r_t + discount * (1 - term_t) * V'(o_{t+1})."""
        cfg = self.config
        z_target = self.model_target.encode(next_obs)  # (B, H, L) consistency targets
        # As TD-MPC: next latent from the online encoder, policy action from the online prior, value
        # from the target Q ensemble.
        z_next = self.model.encode(next_obs)
        q_next = self.model_target.q(z_next, self.model.pi(z_next))  # (n_q, B, H)
        subset = torch.randperm(cfg.n_q, device=reward.device)[: cfg.n_q_min]
        v_next = q_next[subset].min(dim=0).values
        td_target = reward + cfg.discount * (1.0 - terminated) * v_next  # (B, H)
        if cfg.absorbing_terminal:  # a terminated step's final state keeps paying its own reward
            td_target = td_target + cfg.discount * terminated * reward / (1.0 - cfg.discount)
        return z_target, td_target

    def _latent_rollout(self, first_obs: Tensor, action: Tensor) -> Tensor:
        """The latents (B, H+1, L) from z_0 = h(o_0) (`first_obs` (B, D)) through the learned dynamics with
        the actions (B, H, A)."""
        z = self.model.encode(first_obs)
        latents = [z]
        for t in range(action.shape[1]):
            z = self.model.next(z, action[:, t])
            latents.append(z)
        return torch.stack(latents, dim=1)

    def _policy_loss(self, z_pi: Tensor, rho: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """`(policy loss, the policy's actions (B, H+1, A), extra outputs)` on the detached latents `z_pi`
        (B, H+1, L): maximise Q along them, Q's weights detached so that this term trains pi alone; with the
        Gaussian prior the extra outputs hold its entropy (`prior_entropy`)."""
        cfg = self.config
        stochastic = self.model.stochastic_prior
        if stochastic:  # a reparameterised draw, so the gradient reaches the mean and the std
            eps = torch.randn(*z_pi.shape[:-1], self.action_dim, device=z_pi.device, dtype=z_pi.dtype)
            pi_actions, log_prob = self.model.pi_sample(z_pi, eps)  # (B, H+1, A), (B, H+1)
        else:
            pi_actions = self.model.pi(z_pi)  # (B, H+1, A)
        q_pi = self.model.q(z_pi, pi_actions, detach_params=True)  # (n_q, B, H+1)
        subset_pi = torch.randperm(cfg.n_q, device=z_pi.device)[: cfg.n_q_min]
        q_pi = q_pi[subset_pi]
        q_pi = q_pi.min(dim=0).values if cfg.policy_q_reduction == "min" else q_pi.mean(dim=0)  # (B, H+1)
        if self.training:
            with torch.no_grad():
                self.q_scale.lerp_(self._q_scale_statistic(q_pi), 1.0 - cfg.q_scale_momentum)
        objective = q_pi / self.q_scale.clamp_min(1.0)  # (B, H+1)
        extra = {}
        if stochastic:
            entropy = -log_prob * self.action_dim  # TD-MPC2 scales the entropy by the action dims
            objective = objective + cfg.prior_entropy_coeff * entropy
            extra["prior_entropy"] = entropy.detach().mean()
        policy_loss = -(rho * objective.mean(dim=0)).sum() / z_pi.shape[1]
        return policy_loss, pi_actions, extra

    def _bc_loss(
        self, batch: dict[str, Tensor], action: Tensor, z_pi: Tensor, pi_actions: Tensor, w: Tensor
    ) -> Tensor:
        """With `bc_coeff > 0`: the rho-discounted (`w` (H,)) squared error of the prior's mean action
        against the batch's `action` (B, H, A) on the rows marked `FROM_DEMONSTRATIONS`; else 0."""
        if not (self.config.bc_coeff > 0 and FROM_DEMONSTRATIONS in batch):
            return action.new_zeros(())
        # A masked mean rather than indexing, so that no count is read back to the host.
        demo = batch[FROM_DEMONSTRATIONS].to(action.dtype)  # (B,)
        prior = self.model.pi(z_pi) if self.model.stochastic_prior else pi_actions  # the Gaussian's mean
        sq_err = ((prior[:, :-1] - action) ** 2).mean(dim=2)  # (B, H)
        bc_err = (demo.unsqueeze(1) * sq_err).sum(dim=0) / demo.sum().clamp_min(1.0)  # (H,)
        return (w * bc_err).sum() / action.shape[1]

    def _q_scale_statistic(self, q_pi: Tensor) -> Tensor:
        """This batch's value of the statistic `q_scale` tracks, from the policy's Q values (B, H+1): the mean
        |Q|, or (TD-MPC2) the 95th minus the 5th percentile over the batch at the first step, at least 1."""
        q_pi = q_pi.detach().float()
        if self.config.q_scale_stat == "mean_abs":
            stat = q_pi.abs().mean()
        else:
            low, high = torch.quantile(q_pi[:, 0], q_pi.new_tensor([0.05, 0.95]))
            stat = (high - low).clamp_min(1.0)
        return stat.to(self.q_scale.dtype)

    @torch.no_grad()
    def update_target(self, tau: float | None = None) -> None:
        """EMA step of the target network: target <- (1 - tau) * target + tau * online (tau from the config)."""
        tau = self.config.tau if tau is None else tau
        online = list(self.model.parameters())
        target = list(self.model_target.parameters())
        torch._foreach_lerp_(target, online, tau)
