"""`TDMPCConfig`: TD-MPC (Hansen et al. 2022) with some FOWM refinements, learned online from a replay buffer.

Defaults follow the papers for the planner (horizon 5, 6 MPPI iterations, 512 samples, 64 elites, 24 policy
trajectories, temperature 0.5, momentum 0.1) and for the loss weights (consistency 2, reward 0.5, value 0.1,
temporal discount rho 0.5). Deviations, and why:

- An ensemble of `n_q=5` Q-functions whose TD targets and policy objective take the minimum over `n_q_min=2`
  members drawn at random each update (FOWM / REDQ): less over-estimation than TD-MPC's two Q-functions.
- Hidden layers are Linear -> LayerNorm -> ELU (TD-MPC's ELU plus FOWM's LayerNorm; Mish, as in FOWM and
  TD-MPC2, is slower than ELU on CPU for no gain we could see: `activation` chooses), and the latent state
  is SimNorm-ed
  (softmax over groups of `simnorm_dim` units, TD-MPC2): the latent stays bounded so long latent rollouts and
  the consistency loss cannot blow up. `latent_dim` must therefore be a multiple of `simnorm_dim`.
- `absorbing_terminal` (off by default) values a terminated episode's final state as absorbing, for tasks
  such as PushT whose termination is success (the option's comment says why); `reward_exponent` (1 by
  default) sharpens rewards in [0, 1] so that the last stretch to the goal is worth more; `plan_pessimism`
  (0 by default) makes the planner distrust final states where the Q ensemble disagrees.
- `prior_entropy_coeff` (0 by default) makes the policy prior TD-MPC2's entropy-regularised Gaussian.
- `value_bins` (0 by default) swaps the squared-error reward and value regression for TD-MPC2's
  cross-entropy over two-hot bins in symlog space.
- The policy objective is divided by a running estimate of the Q scale so that tasks with large returns
  (Pendulum: rewards down to -16 per step) do not let the policy gradient dominate the shared gradient clip.

The planner defaults are sized for a GPU; docs/tdmpc.md gives smaller ones for CPU experiments as overrides.
"""

from __future__ import annotations

from dataclasses import dataclass

from lerobot.config import ONLINE, PolicyConfig
from lerobot.constants import ENV_STATE, STATE, VISUAL
from lerobot.errors import ConfigError
from lerobot.policies.tdmpc.networks import ACTIVATIONS

PLAN_ACTIONS = ("elite", "mean")
Q_SCALE_STATS = ("mean_abs", "percentile_range")
Q_REDUCTIONS = ("min", "mean")


@dataclass
class TDMPCConfig(PolicyConfig):
    """TD-MPC: latent world model + Q ensemble + policy prior, acting by MPPI planning in latent space."""

    name: str = "tdmpc"
    training_mode: str = ONLINE  # one observation in, one action out: `PolicyConfig`'s n_obs/action_steps

    # Optimisation (TD-MPC/FOWM state-based tasks): `PolicyConfig`'s AdamW betas and eps with weight decay 0,
    # i.e. Adam.
    batch_size: int = 256
    optimizer_lr: float = 3e-4

    # Architecture.
    latent_dim: int = 64
    enc_dim: int = 256
    mlp_dim: int = 512
    simnorm_dim: int = 8
    n_q: int = 5
    n_q_min: int = 2

    # Learning: sequence length of a training sample, discounts, loss weights, target network EMA.
    horizon: int = 5
    discount: float = 0.99
    rho: float = 0.5
    consistency_coeff: float = 2.0
    reward_coeff: float = 0.5
    value_coeff: float = 0.1
    policy_coeff: float = 1.0
    # Beyond TD-MPC as published: weight of a behaviour-cloning term that pulls pi toward the demonstrations'
    # actions on a batch's demonstration rows (`training.offline_ratio > 0`), (pi(z_t) - a_t)^2 in
    # normalised action units. MoDem (Hansen et al. 2023) pretrains pi this way; here the term stays for the
    # whole run. 0.4 weighs it against the Q term (normalised by its running scale) as TD3+BC's alpha=2.5.
    bc_coeff: float = 0.0
    tau: float = 0.01
    # Beyond TD-MPC as published: the value target of a transition that ended its episode by termination.
    # False (the paper): no bootstrap, the target is the last reward alone. True: the final state is absorbing
    # and keeps paying its reward, target r / (1 - discount). PushT terminates on success, so without it
    # reaching the goal is worth one step of reward while hovering just short of it pays every step.
    absorbing_terminal: bool = False
    # Beyond TD-MPC as published: the model and value learn from r ** reward_exponent (rewards must lie in
    # [0, 1]; 1 is the env's own reward). PushT pays clip(coverage / 0.95, 0, 1): hovering at 90% coverage
    # earns 0.95 of a success's reward, so the value barely tells finishing from hovering; an exponent of 4
    # makes it 0.81. Evaluation still reports the env's reward.
    reward_exponent: float = 1.0
    # Beyond TD-MPC as published (TD-MPC2's discrete regression): 0 keeps scalar reward and Q heads learned by
    # squared error; >= 2 makes each head output logits over that many bins evenly spaced in symlog space on
    # [-10, 10], learned by cross-entropy against the target's two-hot encoding (TD-MPC2 uses 101). The
    # loss then does not grow with the size of the returns; planning and the policy still see scalars.
    value_bins: int = 0
    # Beyond TD-MPC as published (TD-MPC2's policy prior): 0 keeps the deterministic tanh prior, whose planner
    # trajectories get `min_std` noise; > 0 makes the prior a tanh-squashed Gaussian with a learned std,
    # trained to maximise Q plus this weight times its entropy (times the action dims, as TD-MPC2, which uses
    # 1e-4). Its draws seed the planner; the value targets and the planner's terminal value take its mean.
    prior_entropy_coeff: float = 0.0
    # EMA decay of the running Q scale that normalises the policy objective, and what it tracks:
    # "mean_abs" the mean |Q| over the batch and the rollout; "percentile_range" (TD-MPC2) the spread between
    # the 5th and 95th percentiles over the batch of the first step's Q, at least 1.
    q_scale_momentum: float = 0.99
    q_scale_stat: str = "mean_abs"
    # How the policy objective combines the `n_q_min` Q-functions drawn at random: "min" (FOWM / REDQ, as the
    # TD targets) or "mean" (TD-MPC2).
    policy_q_reduction: str = "min"
    # Beyond TD-MPC as published (TD-MPC2's options): the hidden activation ("elu": TD-MPC; "mish":
    # TD-MPC2, slower on a CPU), dropout on the Q-functions' first hidden layer during updates (TD-MPC2:
    # 0.01; targets and planning never drop), and the encoder's learning rate as a multiple of
    # `optimizer_lr` (TD-MPC2: 0.3).
    activation: str = "elu"
    q_dropout: float = 0.0
    encoder_lr_scale: float = 1.0

    # Planning (MPPI in latent space). `plan_horizon` defaults to `horizon` when null.
    use_mpc: bool = True
    plan_horizon: int | None = None
    iterations: int = 6
    num_samples: int = 512
    num_elites: int = 64
    num_pi_trajs: int = 24
    temperature: float = 0.5
    momentum: float = 0.1
    min_std: float = 0.05
    max_std: float = 2.0
    # TD-MPC's warm-up schedules, over the first `schedule_steps` transitions collected (0: none, the final
    # values from the start): the floor of the planner's std falls linearly from `std_schedule_start` to
    # `min_std` (more exploration while the model is poor) and the planning horizon rises linearly from 1
    # to its full length, rounded down (short plans while the model's rollouts are unreliable). TD-MPC:
    # 25,000 steps from 0.5. The noise of the policy trajectories stays `min_std`, as in TD-MPC. A
    # checkpoint loaded for evaluation plans with the final values.
    schedule_steps: int = 0
    std_schedule_start: float = 0.5
    # Which action sequence a planning call returns. "elite" (TD-MPC): one final elite drawn by its score.
    # "mean" (beyond TD-MPC as published): the final MPPI mean, the sequence the next call warm-starts from;
    # it carries no sampling noise of its own, for tasks that end on a precise placement.
    plan_action: str = "elite"
    # Beyond TD-MPC as published: the planner scores a candidate's final state by the Q ensemble's mean minus
    # `plan_pessimism` times the members' standard deviation (0: the mean alone, as TD-MPC). A harder search
    # finds the sequences whose value the model over-estimates; where the members disagree the value is less
    # trusted. Acting only: the losses do not change, so it can be set at evaluation on any checkpoint.
    plan_pessimism: float = 0.0
    # Seed of the per-env planner noise; the env in batch slot b uses `planner_seed + b` until
    # `TDMPCPolicy.set_noise_seed` says otherwise.
    planner_seed: int = 0

    @property
    def planning_horizon(self) -> int:
        """Number of steps the planner looks ahead."""
        return self.plan_horizon if self.plan_horizon is not None else self.horizon

    def validate(self) -> None:
        super().validate()
        if self.n_obs_steps != 1:
            raise ConfigError(f"policy.n_obs_steps={self.n_obs_steps}: tdmpc encodes one observation, use 1")
        if self.n_action_steps > self.planning_horizon:
            raise ConfigError(
                f"policy.n_action_steps={self.n_action_steps} exceeds the planning horizon "
                f"{self.planning_horizon}"
            )
        if self.latent_dim % self.simnorm_dim != 0:
            raise ConfigError(
                f"policy.latent_dim={self.latent_dim} must be a multiple of policy.simnorm_dim={self.simnorm_dim}"
            )
        if not 1 <= self.n_q_min <= self.n_q:
            raise ConfigError(f"policy.n_q_min={self.n_q_min} must be in [1, policy.n_q={self.n_q}]")
        if self.horizon < 1 or self.planning_horizon < 1:
            raise ConfigError("policy.horizon and policy.plan_horizon must be >= 1")
        if self.use_mpc and not 1 <= self.num_elites <= self.num_samples + self.num_pi_trajs:
            raise ConfigError(
                f"policy.num_elites={self.num_elites} must be in [1, num_samples + num_pi_trajs]"
            )
        if self.iterations < 1 or self.num_samples < 1 or self.num_pi_trajs < 0:
            raise ConfigError("policy.iterations and policy.num_samples must be >= 1, num_pi_trajs >= 0")
        if self.reward_exponent <= 0:
            raise ConfigError(f"policy.reward_exponent={self.reward_exponent} must be > 0")
        if self.value_bins < 0 or self.value_bins == 1:
            raise ConfigError(
                f"policy.value_bins={self.value_bins}: use 0 for scalar heads or >= 2 bins (TD-MPC2: 101)"
            )
        if self.prior_entropy_coeff < 0:
            raise ConfigError(f"policy.prior_entropy_coeff={self.prior_entropy_coeff} must be >= 0")
        if self.bc_coeff < 0:
            raise ConfigError(f"policy.bc_coeff={self.bc_coeff} must be >= 0")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError(f"policy.tau={self.tau} must be in (0, 1]")
        if not 0.0 < self.min_std <= self.max_std:
            raise ConfigError(
                f"policy.min_std={self.min_std} and max_std={self.max_std}: need 0 < min <= max"
            )
        if self.schedule_steps < 0:
            raise ConfigError(f"policy.schedule_steps={self.schedule_steps} must be >= 0 (0: no schedule)")
        if self.schedule_steps > 0 and self.n_action_steps != 1:
            raise ConfigError(
                f"policy.schedule_steps={self.schedule_steps} plans 1 step ahead at first: it needs "
                f"policy.n_action_steps=1, got {self.n_action_steps}"
            )
        if self.schedule_steps > 0 and not self.min_std <= self.std_schedule_start <= self.max_std:
            raise ConfigError(
                f"policy.std_schedule_start={self.std_schedule_start} must lie in [min_std={self.min_std}, "
                f"max_std={self.max_std}]"
            )
        if self.plan_pessimism < 0:
            raise ConfigError(f"policy.plan_pessimism={self.plan_pessimism} must be >= 0")
        if self.plan_action not in PLAN_ACTIONS:
            raise ConfigError(f"policy.plan_action={self.plan_action!r}: choose one of {PLAN_ACTIONS}")
        if self.q_scale_stat not in Q_SCALE_STATS:
            raise ConfigError(f"policy.q_scale_stat={self.q_scale_stat!r}: choose one of {Q_SCALE_STATS}")
        if self.policy_q_reduction not in Q_REDUCTIONS:
            raise ConfigError(
                f"policy.policy_q_reduction={self.policy_q_reduction!r}: choose one of {Q_REDUCTIONS}"
            )
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"policy.activation={self.activation!r}: choose one of {ACTIVATIONS}")
        if not 0.0 <= self.q_dropout < 1.0:
            raise ConfigError(f"policy.q_dropout={self.q_dropout} must be in [0, 1) (TD-MPC2: 0.01)")
        if self.encoder_lr_scale <= 0:
            raise ConfigError(f"policy.encoder_lr_scale={self.encoder_lr_scale} must be > 0 (TD-MPC2: 0.3)")
        for key, feat in {**self.input_features, **self.output_features}.items():
            if feat.kind == VISUAL:
                raise ConfigError(
                    f"tdmpc takes low-dimensional observations only; {key!r} is an image "
                    "(use env=pusht_keypoints instead of env=pusht)"
                )
            if feat.low is None or feat.high is None:
                raise ConfigError(
                    f"tdmpc normalises with the feature bounds; {key!r} declares no low/high in the env config"
                )
        if not any(f.kind in (STATE, ENV_STATE) for f in self.input_features.values()):
            raise ConfigError("tdmpc needs at least one state or env_state observation feature")
