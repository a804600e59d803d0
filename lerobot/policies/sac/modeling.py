"""`SACPolicy`: Soft Actor-Critic's actor, critics and temperature, their losses, and acting through the `Policy`
base class.

Acting path: `select_action` (base class) -> `predict_action_chunk`: features of the current observation, then
a draw from the actor while `explore` is on (data collection), its mean action tanh(mean) otherwise
(evaluation); one action (B, 1, A) in env units.

Learning path: the online trainer samples single transitions (`replay_horizon` 1) and calls `forward`:

    batch[obs key]            (B, 2, ...)  o_t, o_{t+1} (the real next observation, also after a time limit)
    batch["action"]           (B, 1, A)    a_t, env units
    batch["next.reward"]      (B, 1)       r_t
    batch["next.terminated"]  (B, 1)       1 where o_{t+1} ended the episode by termination: no bootstrap

`forward` returns the sum of SAC's three losses, which the trainer's one optimizer steps on; then
`update_target()` moves the target critics (and target encoder) towards the online ones by `tau`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

from lerobot.constants import (
    ACTION,
    ACTION_KIND,
    ENV_STATE,
    NEXT_REWARD,
    NEXT_TERMINATED,
    STATE,
    TRAINING_NOISE_PREFIX,
    VISUAL,
)
from lerobot.errors import ConfigError
from lerobot.normalize import MIN_MAX, Normalize, Unnormalize
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.policies.policy import acting_settings
from lerobot.policies.sac.configuration import SACConfig
from lerobot.policies.sac.networks import (
    PixelEncoder,
    QEnsemble,
    TanhGaussianActor,
    draw_shift_offsets,
    random_shift,
)

# The per-sample draws of a training batch (`SACPolicy.draw_training_noise`); index 0 of the second dim is for
# o_t, index 1 for o_{t+1}.
ACTOR_NOISE = TRAINING_NOISE_PREFIX + "actor"  # (B, 2, A) float32: the actor's reparameterisation noise
SHIFT_OFFSETS = TRAINING_NOISE_PREFIX + "shift_offsets"  # (B, 2, 2) int64: (top, left) of the random shifts


class SlotNoise:
    """One CPU `torch.Generator` per env slot for the exploration noise (not a module: no weights).

    Slot b is seeded `seed + b` (an int seed) or `seeds[b]` (a sequence); a generator is made on first use, so
    `reset` restarts every slot's stream from its seed.
    """

    def __init__(self, seed: int):
        self.set_seed(seed)

    def set_seed(self, seed: int | Sequence[int]) -> None:
        """An int gives slot b the seed `seed + b`; a sequence gives one seed per slot."""
        if isinstance(seed, int):
            self._base, self._explicit = seed, None
        else:
            self._base, self._explicit = 0, [int(s) for s in seed]
        self.reset()

    def reset(self) -> None:
        """Restart every slot's stream from its seed."""
        self._generators: dict[int, torch.Generator] = {}

    def generators(self, slots: Sequence[int]) -> list[torch.Generator]:
        """The generators of env slots `slots`, in that order."""
        out = []
        for slot in slots:
            if slot not in self._generators:
                if self._explicit is not None and slot >= len(self._explicit):
                    raise ValueError(
                        f"exploration noise seeded for {len(self._explicit)} envs, asked for slot {slot}"
                    )
                seed = self._explicit[slot] if self._explicit is not None else self._base + slot
                self._generators[slot] = torch.Generator().manual_seed(seed)
            out.append(self._generators[slot])
        return out


class SACPolicy(OnlinePolicy):
    """Soft Actor-Critic with automatic entropy tuning, from state vectors and/or pixels (DrQ).

    `dataset_stats` is accepted for the factory's signature and ignored: normalisation comes from the features'
    `low`/`high` bounds, which online RL knows before it has seen any data (as TD-MPC).

    As an `OnlinePolicy`: `replay_horizon` is 1, `update_target()` is a Polyak step of the target critics (and
    target encoder), `set_noise_seed()` seeds the per-env exploration noise, and `explore` switches acting
    between a draw from the actor and its mean action.
    """

    def __init__(self, config: SACConfig, dataset_stats: dict | None = None):
        super().__init__(**acting_settings(config))
        config.validate()
        self.config = config
        inputs = config.input_features
        self.image_keys = sorted(k for k, f in inputs.items() if f.kind == VISUAL)
        self.vector_keys = sorted(k for k, f in inputs.items() if f.kind in (STATE, ENV_STATE))
        self.action_key = config.action_key
        self.action_dim = config.action_dim
        self.normalize_inputs = Normalize(
            {k: inputs[k] for k in self.vector_keys},
            {STATE: MIN_MAX, ENV_STATE: MIN_MAX},
            bounds_fallback=True,
        )
        self.normalize_action = Normalize(
            config.output_features, {ACTION_KIND: MIN_MAX}, bounds_fallback=True
        )
        self.unnormalize_action = Unnormalize(
            config.output_features, {ACTION_KIND: MIN_MAX}, bounds_fallback=True
        )

        feature_dim = sum(math.prod(inputs[k].shape) for k in self.vector_keys)
        self.encoder: PixelEncoder | None = None
        self.encoder_target: PixelEncoder | None = None
        if self.image_keys:
            _, height, width = inputs[self.image_keys[0]].shape
            self.encoder = PixelEncoder(
                in_channels=sum(inputs[k].shape[0] for k in self.image_keys),
                image_size=(height, width),
                channels=config.image_encoder_channels,
                layers=config.image_encoder_layers,
                feature_dim=config.image_feature_dim,
            )
            self.encoder_target = copy.deepcopy(self.encoder).requires_grad_(False)
            feature_dim += config.image_feature_dim
        self.actor = TanhGaussianActor(feature_dim, list(config.hidden_dims), self.action_dim)
        self.critic = QEnsemble(config.n_q, feature_dim, self.action_dim, list(config.hidden_dims))
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(config.init_temperature)))
        self.noise = SlotNoise(config.noise_seed)

    @property
    def replay_horizon(self) -> int:
        """SAC learns from single transitions."""
        return 1

    def check_run(self, training_cfg: Any, action_space: spaces.Space | None = None) -> None:
        """Refuse, in one line each (`ConfigError`), an online run that cannot train SAC: one that makes no
        gradient updates (`training.gradient_steps=0` with no `utd_ratio`, or `utd_ratio=0`), and an env
        whose action space (`action_space`, the train envs' single one) is not a bounded continuous box of
        the declared action's shape (a discrete one: SAC's actor is a squashed Gaussian).

        `training_cfg` is the run's `training` section (`gradient_steps`, `utd_ratio`); the online trainer
        calls this at start-up, before the first transition.
        """
        utd_ratio = training_cfg.utd_ratio
        if utd_ratio is None and training_cfg.gradient_steps == 0:
            raise ConfigError(
                "training.gradient_steps=0: SAC would collect without ever learning; use 1 (one update per "
                "vector step, SB3's default), N, or -1 (as many updates as transitions collected)"
            )
        if utd_ratio is not None and utd_ratio == 0:
            raise ConfigError(
                "training.utd_ratio=0: SAC would collect without ever learning; use a positive ratio (1: one "
                "update per transition), or null for training.gradient_steps"
            )
        if action_space is None:
            return
        shape = (self.action_dim,)
        if not isinstance(action_space, spaces.Box) or not np.issubdtype(action_space.dtype, np.floating):
            raise ConfigError(
                f"sac acts in a continuous (Box) action space; this env's is {action_space} (a discrete or "
                "integer action space needs another policy)"
            )
        if action_space.shape != shape or not action_space.is_bounded("both"):
            raise ConfigError(
                f"sac squashes actions into the env's bounds: the env's action space is {action_space}, the "
                f"config declares {self.action_key!r} of shape {list(shape)}; it needs a bounded Box of that "
                "shape"
            )

    @property
    def obs_keys(self) -> list[str]:
        """The observation keys the policy reads: cameras, then vectors."""
        return [*self.image_keys, *self.vector_keys]

    # ----------------------------------------------------------------- features
    def features(
        self,
        obs: dict[str, Tensor],
        encoder: PixelEncoder | None,
        shifts: Tensor | None,
        vectors: Tensor | None = None,
    ) -> Tensor:
        """What actor and critics read, (B, D): the image features of `encoder` (the cameras stacked on the
        channels, shifted by `shifts` (B, 2) when given), then the normalised, flattened vectors
        (`vector_features`, or `vectors` when given: already made).

        `obs` holds `{key: (B, ...)}`.
        """
        parts = []
        if encoder is not None:
            images = torch.cat([obs[k] for k in self.image_keys], dim=1)  # (B, sum of C, H, W)
            if shifts is not None:
                images = random_shift(images, self.config.image_shift_pad, shifts)
            parts.append(encoder(images))
        if self.vector_keys:
            parts.append(self.vector_features(obs) if vectors is None else vectors)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def vector_features(self, obs: dict[str, Tensor]) -> Tensor:
        """The state vectors of `obs` ({key: (..., *shape)}, any leading dims) normalised, flattened and
        concatenated: (..., sum of their sizes)."""
        normed = self.normalize_inputs({k: obs[k] for k in self.vector_keys})
        inputs = self.config.input_features
        parts = [
            normed[k].reshape(*normed[k].shape[: normed[k].dim() - len(inputs[k].shape)], -1)
            for k in self.vector_keys
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    # ----------------------------------------------------------------- acting
    def on_reset(self, env_ids: Tensor | None) -> None:
        noise = getattr(self, "noise", None)  # the base __init__ resets before our attributes exist
        if noise is not None and env_ids is None:
            noise.reset()

    def set_noise_seed(self, seed: int | Sequence[int]) -> None:
        """Seed the exploration noise: an int gives env slot b `seed + b`; a sequence gives one seed per slot."""
        self.noise.set_seed(seed)

    def _exploration_noise(self, batch_size: int) -> Tensor:
        """Standard normal noise (B, A) on the CPU, row b from the stream of the env slot it acts for: the
        episode's stream when `select_action` has one (`noise_generators`), else the slot's own."""
        generators = self.noise_generators()
        if generators is None:
            ids = self.chunk_env_ids
            generators = self.noise.generators(range(batch_size) if ids is None else ids.tolist())
        return torch.stack([torch.randn(self.action_dim, generator=g) for g in generators])

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor]) -> Tensor:
        """One action (B, 1, A) in env units from observations (B, n_obs_steps=1, ...): drawn from the actor
        while `explore` is on, tanh of its mean otherwise."""
        x = self.features({k: batch[k][:, -1] for k in self.obs_keys}, self.encoder, None)
        if self.explore:
            eps = self._exploration_noise(x.shape[0]).to(x.device, non_blocking=True)
            action = self.actor.draw(x, eps)
        else:
            action = self.actor.mode(x)
        return self.unnormalize_action({self.action_key: action.unsqueeze(1)})[self.action_key]

    # ----------------------------------------------------------------- learning
    def draw_training_noise(self, n: int) -> dict[str, Tensor]:
        """The random numbers of a training `forward` on `n` samples, from the CPU stream: the actor's noise for
        o_t and o_{t+1} (`ACTOR_NOISE`), and, from pixels in training mode, the random shifts of both
        (`SHIFT_OFFSETS`)."""
        draws = {ACTOR_NOISE: torch.randn(n, 2, self.action_dim, device="cpu")}
        if self.encoder is not None and self.training and self.config.image_shift_pad > 0:
            draws[SHIFT_OFFSETS] = draw_shift_offsets(2 * n, self.config.image_shift_pad).view(n, 2, 2)
        return draws

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The training step's output: `loss`, the sum of SAC's three losses (`losses`), and figures to log.

        The three terms reach disjoint parameters (critics and encoder; actor; log_alpha) and Adam's update is per
        parameter, so one step on their sum is the three separate Adam steps at one learning rate, provided the
        trainer's global gradient clip does not fire (it would scale all three by one factor;
        configs/experiment/sac_pendulum.yaml turns it off, as SB3 has none).

        Order: every term is computed from the parameters before the step. SB3 steps the critics first and then
        evaluates the actor's loss on the updated critics; here the actor sees the critics one update old. We
        accept that: one optimizer step over all parameters cannot do otherwise without a learner-specific
        branch in the trainer, and the lag is a single Adam step of the critics (lr 3e-4), small beside the
        change the actor's own step makes to the action.
        """
        out = self.losses(batch)
        loss = out["critic_loss"] + out["actor_loss"] + out["alpha_loss"]
        return {"loss": loss, **{k: v.detach() for k, v in out.items()}}

    def losses(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """SAC's three losses on single transitions (see the module docstring for the batch layout), still in
        the graph, and detached figures (`alpha`, `entropy`, `q_mean`, `td_target_mean`):

        - `critic_loss`: 1/2 sum over k of the batch mean of (Q_k(x_t, a_t) - y)^2, y from `soft_td_target`.
        - `actor_loss`: the batch mean of alpha * log pi(a | x_t) - min_k Q_k(x_t, a), a ~ pi(. | x_t)
          reparameterised, on detached features with the critics' weights detached: it moves the actor alone.
        - `alpha_loss`: the batch mean of -log_alpha * (log pi(a | x_t) + target entropy), log pi detached: it
          moves log_alpha alone (on log alpha, as SB3 and softlearning).

        alpha enters the critic and actor terms detached; the encoder learns from the critic loss alone.
        """
        if batch[ACTION].shape[1] != 1:
            raise ValueError(
                f"sac learns from single transitions: action (B, 1, A), got {tuple(batch[ACTION].shape)}"
            )
        draws = {k: v for k, v in batch.items() if k.startswith(TRAINING_NOISE_PREFIX)}
        draws = draws or self.draw_training_noise(batch[ACTION].shape[0])
        eps = draws[ACTOR_NOISE].to(batch[ACTION].device, non_blocking=True)  # (B, 2, A)
        shifts = draws.get(SHIFT_OFFSETS)  # (B, 2, 2), or None: no augmentation
        shift_now, shift_next = (None, None) if shifts is None else (shifts[:, 0], shifts[:, 1])
        obs = {k: batch[k][:, 0] for k in self.image_keys}
        next_obs = {k: batch[k][:, 1] for k in self.image_keys}
        # The state vectors of o_t and o_{t+1} normalised in one pass: (B, 2, D_v).
        vectors = self.vector_features(batch) if self.vector_keys else None
        now, nxt = (None, None) if vectors is None else (vectors[:, 0], vectors[:, 1])
        action = self.normalize_action({self.action_key: batch[ACTION][:, 0]})[self.action_key]  # (B, A)
        reward = batch[NEXT_REWARD][:, 0].float()  # (B,)
        terminated = batch.get(NEXT_TERMINATED, torch.zeros_like(batch[NEXT_REWARD]))[:, 0].float()
        alpha = self.log_alpha.detach().exp()

        td_target = self.soft_td_target(next_obs, reward, terminated, eps[:, 1], shift_next, nxt)
        x = self.features(obs, self.encoder, shift_now, now)  # (B, D)
        q = self.critic(x, action).float()  # (n_q, B)
        critic_loss = 0.5 * (q - td_target).pow(2).mean(dim=1).sum()

        x_pi = x.detach()
        pi_action, log_prob = self.actor.sample(x_pi, eps[:, 0])
        q_pi = self.critic(x_pi, pi_action, detach_params=True).float().min(dim=0).values  # (B,)
        actor_loss = (alpha * log_prob - q_pi).mean()
        alpha_loss = -(self.log_alpha * (log_prob.detach() + self.config.entropy_target)).mean()
        return {
            "critic_loss": critic_loss,
            "actor_loss": actor_loss,
            "alpha_loss": alpha_loss,
            "alpha": alpha,
            "entropy": -log_prob.detach().mean(),
            "q_mean": q.detach().mean(),
            "td_target_mean": td_target.mean(),
        }

    @torch.no_grad()
    def soft_td_target(
        self,
        next_obs: dict[str, Tensor],
        reward: Tensor,
        terminated: Tensor,
        eps: Tensor,
        shifts: Tensor | None = None,
        vectors: Tensor | None = None,
    ) -> Tensor:
        """The soft TD target (B,): y = r + discount * (1 - terminated) * (min_k Q'_k(x', a') - alpha log pi(a' | x)),
        a' = the actor's draw with noise `eps` (B, A) on the online features x of `next_obs` ({key: (B, ...)}),
        Q' the target critics on the target encoder's features x' (the same as x from state). `reward` and
        `terminated` are (B,); a time limit does not cut the bootstrap, so truncation plays no part here.

        The next action comes from the online actor on the online encoder's features, its value from the target
        networks (as DrQ); `shifts` (B, 2), when given, shift the images as in training. `vectors` (B, D_v): the
        normalised state vectors of `next_obs` when already made (`vector_features`).
        """
        x_next = self.features(next_obs, self.encoder, shifts, vectors)
        next_action, next_log_prob = self.actor.sample(x_next, eps)
        if self.encoder is not None:
            x_next = self.features(next_obs, self.encoder_target, shifts, vectors)
        next_q = self.critic_target(x_next, next_action).float().min(dim=0).values  # (B,)
        soft_value = next_q - self.log_alpha.exp() * next_log_prob
        return reward + self.config.discount * (1.0 - terminated) * soft_value

    @torch.no_grad()
    def update_target(self, tau: float | None = None) -> None:
        """Polyak step of the target critics and target encoder: target <- (1 - tau) * target + tau * online
        (tau from the config)."""
        tau = self.config.tau if tau is None else tau
        pairs = [(self.critic_target, self.critic)]
        if self.encoder is not None:
            pairs.append((self.encoder_target, self.encoder))
        target = [p for t, _ in pairs for p in t.parameters()]
        online = [p for _, o in pairs for p in o.parameters()]
        torch._foreach_lerp_(target, online, tau)
