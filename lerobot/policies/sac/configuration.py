"""`SACConfig`: Soft Actor-Critic (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications"), with
automatic entropy tuning, learned online from a replay buffer.

Defaults are Stable-Baselines3's `SAC` defaults: two Q-functions whose minimum forms the target, Polyak-averaged
target critics (tau 0.005, after every update), a learned temperature starting at 1 with target entropy
-|A|, discount 0.99, Adam at 3e-4 for actor, critics and temperature, [256, 256] ReLU MLPs, batch 256.
Stable-Baselines3's training schedule (100 random steps, one update per step) is the trainer's: see
configs/experiment/sac_pendulum.yaml.

From pixels, a DrQ encoder (Kostrikov et al. 2020): `image_encoder_layers` 3x3 convolutions of
`image_encoder_channels` (the first with stride 2), then Linear -> LayerNorm -> tanh to `image_feature_dim`
features, shared by actor and critics and trained by the critic loss alone; training images are shifted by up
to `image_shift_pad` pixels (replicate padding, random crop back).

Normalisation: as TD-MPC, from the features' declared bounds (state, env_state, action mapped to [-1, 1]);
dataset statistics are not used, since online RL has none before it starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lerobot.config import ONLINE, PolicyConfig
from lerobot.constants import ENV_STATE, STATE, VISUAL
from lerobot.errors import ConfigError

# The most entropy (nats) one dimension of a tanh-squashed Gaussian reaches: max over (mean, std) of the
# entropy of tanh(u), u ~ N(mean, std), in [-1, 1]; at mean 0, std 0.874 (by quadrature: tests/test_sac.py).
# Just below log 2, the uniform distribution's. A target entropy at or above action_dim times it is one that
# no actor of SAC's family can reach: the temperature would rise without end.
MAX_TANH_GAUSSIAN_ENTROPY = 0.68364


def conv_output_size(size: int, layers: int) -> int:
    """Side of the DrQ encoder's last feature map for an input of side `size`: a 3x3 convolution with stride 2,
    then `layers - 1` with stride 1, none padded."""
    size = (size - 3) // 2 + 1
    return size - 2 * (layers - 1)


@dataclass
class SACConfig(PolicyConfig):
    """Soft Actor-Critic: a tanh-squashed Gaussian actor, an ensemble of Q-functions and a learned temperature."""

    name: str = "sac"
    training_mode: str = ONLINE  # one observation in, one action out: `PolicyConfig`'s n_obs/action_steps

    # Optimisation (SB3): one Adam rate for actor, critics and temperature (`PolicyConfig`'s AdamW betas and
    # eps with weight decay 0: Adam).
    batch_size: int = 256
    optimizer_lr: float = 3e-4

    # Networks: hidden widths of the actor and of each Q-function (ReLU), and how many Q-functions.
    hidden_dims: list[int] = field(default_factory=lambda: [256, 256])
    n_q: int = 2

    # Learning: discount, Polyak rate of the target critics, the temperature's start and the entropy the
    # temperature steers towards, in nats of the actions normalised to [-1, 1] (null: -action_dim, SAC's
    # heuristic and SB3's "auto"; it must lie below action_dim * MAX_TANH_GAUSSIAN_ENTROPY, about
    # 0.68 * action_dim, the most a tanh-Gaussian actor has).
    discount: float = 0.99
    tau: float = 0.005
    init_temperature: float = 1.0
    target_entropy: float | None = None

    # Pixel encoder (DrQ): conv layers, their channels, the feature size, and the random shift's padding
    # (0: no augmentation).
    image_encoder_layers: int = 4
    image_encoder_channels: int = 32
    image_feature_dim: int = 50
    image_shift_pad: int = 4

    # Seed of the per-env exploration noise; the env in batch slot b uses `noise_seed + b` until
    # `SACPolicy.set_noise_seed` says otherwise.
    noise_seed: int = 0

    @property
    def entropy_target(self) -> float:
        """The entropy the temperature steers towards: `target_entropy`, or -action_dim when it is null."""
        return float(-self.action_dim) if self.target_entropy is None else self.target_entropy

    def validate(self) -> None:
        super().validate()
        if self.n_obs_steps != 1:
            raise ConfigError(f"policy.n_obs_steps={self.n_obs_steps}: sac acts on one observation, use 1")
        if self.n_action_steps != 1:
            raise ConfigError(f"policy.n_action_steps={self.n_action_steps}: sac predicts one action, use 1")
        if self.n_q < 1:
            raise ConfigError(f"policy.n_q={self.n_q} must be >= 1 (SAC: 2)")
        if not self.hidden_dims or min(self.hidden_dims) < 1:
            raise ConfigError(
                f"policy.hidden_dims={list(self.hidden_dims)} must be positive widths, e.g. [256, 256]"
            )
        if not 0.0 <= self.discount <= 1.0:
            raise ConfigError(f"policy.discount={self.discount} must be in [0, 1]")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"policy.tau={self.tau} must be in (0, 1]")
        if not (self.init_temperature > 0 and math.isfinite(self.init_temperature)):
            raise ConfigError(f"policy.init_temperature={self.init_temperature} must be > 0 (SAC: 1.0)")
        if self.image_encoder_layers < 1 or self.image_encoder_channels < 1 or self.image_feature_dim < 1:
            raise ConfigError(
                "policy.image_encoder_layers, image_encoder_channels and image_feature_dim must be >= 1"
            )
        if self.image_shift_pad < 0:
            raise ConfigError(f"policy.image_shift_pad={self.image_shift_pad} must be >= 0 (0: no shift)")
        self._validate_features()
        self._validate_target_entropy()

    def _validate_target_entropy(self) -> None:
        """A set target entropy is finite and reachable: below action_dim * `MAX_TANH_GAUSSIAN_ENTROPY`.

        Negative targets are SAC's usual ones (its default is -action_dim): a continuous density's entropy may be
        any negative number, the narrower the lower. An unreachable one would make the temperature grow for
        ever, and the actor's loss with it, until the actor is as wide as it gets and the critics' signal is
        lost beside the entropy bonus.
        """
        if self.target_entropy is None:
            return
        most = self.action_dim * MAX_TANH_GAUSSIAN_ENTROPY
        if not (math.isfinite(self.target_entropy) and self.target_entropy < most):
            raise ConfigError(
                f"policy.target_entropy={self.target_entropy}: a tanh-Gaussian actor over {self.action_dim} "
                f"action dims has at most {most:.3f} nats of entropy, so the temperature would grow without "
                f"end; use a finite value below that (SAC's default, null, is -{self.action_dim})"
            )

    def _validate_features(self) -> None:
        """Inputs: images (one size for all cameras) and state/env_state vectors with declared bounds; the
        action with declared bounds."""
        image_sizes = set()
        for key, feat in self.input_features.items():
            if feat.kind == VISUAL:
                if len(feat.shape) != 3:
                    raise ConfigError(f"sac: image {key!r} must be (C, H, W), got shape {list(feat.shape)}")
                image_sizes.add(tuple(feat.shape[1:]))
            elif feat.kind in (STATE, ENV_STATE):
                if feat.low is None or feat.high is None:
                    raise ConfigError(
                        f"sac normalises with the feature bounds; {key!r} declares no low/high in the env config"
                    )
            else:
                raise ConfigError(f"sac takes images, state and env_state inputs; {key!r} is a {feat.kind!r}")
        if len(image_sizes) > 1:
            raise ConfigError(f"sac stacks its cameras: they need one size, got {sorted(image_sizes)}")
        if (
            image_sizes
            and min(conv_output_size(s, self.image_encoder_layers) for s in next(iter(image_sizes))) < 1
        ):
            raise ConfigError(
                f"policy.image_encoder_layers={self.image_encoder_layers} leaves no pixel of a "
                f"{list(next(iter(image_sizes)))} image; use fewer layers"
            )
        if not self.input_features:
            raise ConfigError("sac needs at least one image, state or env_state observation feature")
        for key, feat in self.output_features.items():
            if len(feat.shape) != 1 or feat.shape[0] < 1:
                raise ConfigError(
                    f"sac acts in a continuous action space: {key!r} must be a vector of shape [A] with "
                    f"low/high bounds, got shape {list(feat.shape)} (a discrete action space is not supported)"
                )
            if feat.low is None or feat.high is None:
                raise ConfigError(f"sac squashes actions into the bounds; {key!r} declares no low/high")
            bounds = [*feat.low, *feat.high]
            if not all(math.isfinite(v) for v in bounds) or not all(
                lo < hi for lo, hi in zip(feat.low, feat.high)
            ):
                raise ConfigError(
                    f"sac squashes actions into the bounds: {key!r} needs finite low < high, got "
                    f"low={list(feat.low)} high={list(feat.high)}"
                )
