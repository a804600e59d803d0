"""SAC: action and log-prob shapes, the tanh correction, the soft TD target, gradient isolation of the three
losses, the target critics' Polyak step, pixels with DrQ's shift, and an end-to-end online run on Pendulum."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT
from gymnasium import spaces
from omegaconf import OmegaConf
from test_online_train import evaluate_run
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

from lerobot.checkpoints.run import load_run_policy, load_training_state
from lerobot.checkpoints.run_layout import latest_checkpoint
from lerobot.cli import eval_main, train_main
from lerobot.config import FeatureConfig
from lerobot.constants import ACTION, NEXT_REWARD, NEXT_TERMINATED, NEXT_TRUNCATED, OBS_IMAGE, OBS_STATE
from lerobot.errors import ConfigError
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.policies.sac import SACConfig, SACPolicy
from lerobot.policies.sac.configuration import MAX_TANH_GAUSSIAN_ENTROPY
from lerobot.policies.sac.modeling import ACTOR_NOISE, SHIFT_OFFSETS
from lerobot.policies.sac.networks import random_shift, tanh_gaussian_log_prob
from lerobot.policy_registry import policy_config_class

# Asymmetric bounds, so that a missing (un)normalisation shows.
STATE_FEATURE = FeatureConfig(shape=[3], kind="state", low=[-1.0, -1.0, -8.0], high=[1.0, 1.0, 8.0])
ACTION_FEATURE = FeatureConfig(shape=[2], kind="action", low=[-2.0, 0.0], high=[2.0, 10.0])
IMAGE_FEATURE = FeatureConfig(shape=[3, 16, 16], kind="visual")


def tiny_config(pixels: bool = False, **kw) -> SACConfig:
    inputs = {OBS_STATE: STATE_FEATURE, **({OBS_IMAGE: IMAGE_FEATURE} if pixels else {})}
    defaults = dict(
        hidden_dims=[32, 32],
        image_encoder_channels=8,
        image_feature_dim=10,
        input_features=inputs,
        output_features={ACTION: ACTION_FEATURE},
    )
    return SACConfig(**{**defaults, **kw})


def make_policy(seed: int = 0, pixels: bool = False, **kw) -> SACPolicy:
    torch.manual_seed(seed)
    return SACPolicy(tiny_config(pixels, **kw))


def training_batch(batch_size: int = 8, pixels: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
    """Single transitions in env units, as `ReplayBuffer.sample(B, 1)` lays them out."""
    g = torch.Generator().manual_seed(seed)
    low, high = torch.tensor(ACTION_FEATURE.low), torch.tensor(ACTION_FEATURE.high)
    batch = {
        OBS_STATE: (torch.rand(batch_size, 2, 3, generator=g) * 2 - 1) * torch.tensor([1.0, 1.0, 8.0]),
        ACTION: low + (high - low) * torch.rand(batch_size, 1, 2, generator=g),
        NEXT_REWARD: torch.randn(batch_size, 1, generator=g),
        NEXT_TERMINATED: torch.zeros(batch_size, 1, dtype=torch.bool),
        NEXT_TRUNCATED: torch.zeros(batch_size, 1, dtype=torch.bool),
    }
    if pixels:
        batch[OBS_IMAGE] = torch.rand(batch_size, 2, 3, 16, 16, generator=g)
    return batch


def test_sac_is_a_registered_online_policy():
    policy = make_policy()
    assert isinstance(policy, OnlinePolicy) and policy_config_class("sac") is SACConfig
    assert policy.replay_horizon == 1 and policy.explore is False and not policy.reports_priorities
    assert policy.config.entropy_target == -2.0 and policy.log_alpha.item() == 0.0


@pytest.mark.parametrize("explore", [False, True])
def test_actions_lie_in_the_bounds_and_the_mean_action_is_deterministic(explore):
    policy = make_policy().eval()
    policy.explore = explore
    obs = {OBS_STATE: torch.randn(5, 3)}
    actions = policy.select_action(obs)
    assert actions.shape == (5, 2)
    assert torch.all(actions[:, 0].abs() <= 2) and torch.all((actions[:, 1] >= 0) & (actions[:, 1] <= 10))
    chunk = policy.predict_action_chunk({OBS_STATE: obs[OBS_STATE][:, None]})
    assert chunk.shape == (5, 1, 2)
    if not explore:  # tanh of the mean, unnormalised: the same every call
        x = policy.features(obs, None, None)
        expected = torch.tanh(policy.actor(x)[0]) * torch.tensor([2.0, 5.0]) + torch.tensor([0.0, 5.0])
        torch.testing.assert_close(chunk[:, 0], expected)
        torch.testing.assert_close(policy.predict_action_chunk({OBS_STATE: obs[OBS_STATE][:, None]}), chunk)


def test_sample_shapes():
    policy = make_policy()
    x = torch.randn(4, 7, 3)
    action, log_prob = policy.actor.sample(x, torch.randn(4, 7, 2))
    assert action.shape == (4, 7, 2) and log_prob.shape == (4, 7)
    assert torch.all(action.abs() < 1) and torch.isfinite(log_prob).all()


def test_tanh_log_prob_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(64, 3, generator=g, dtype=torch.float64) * 2
    log_std = torch.rand(64, 3, generator=g, dtype=torch.float64) * 3 - 2
    u = mean + log_std.exp() * torch.randn(64, 3, generator=g, dtype=torch.float64)
    # cache_size=1: log_prob of the transform's own output reuses u instead of atanh(tanh(u)).
    squash = TanhTransform(cache_size=1)
    reference = TransformedDistribution(Normal(mean, log_std.exp()), [squash]).log_prob(squash(u)).sum(-1)
    torch.testing.assert_close(tanh_gaussian_log_prob(u, mean, log_std), reference)
    # Far in the tails 1 - tanh(u)^2 underflows in float32; the stable form stays finite and accurate.
    far = torch.tensor([[12.0, -15.0, 0.5]])
    exact = tanh_gaussian_log_prob(far.double(), torch.zeros(1, 3).double(), torch.zeros(1, 3).double())
    torch.testing.assert_close(
        tanh_gaussian_log_prob(far, torch.zeros(1, 3), torch.zeros(1, 3)), exact.float()
    )


def test_soft_td_target_takes_the_min_over_qs_and_stops_at_termination_only():
    policy = make_policy(n_q=2, discount=0.9, init_temperature=0.5)
    # Target critic 1 = target critic 0 + 3 everywhere: the minimum is critic 0's value.
    with torch.no_grad():
        net = policy.critic_target.net
        for w, b in zip(net.weights, net.biases):
            w[1], b[1] = w[0], b[0]
        net.biases[-1][1] += 3.0
    next_obs = {OBS_STATE: torch.randn(3, 3)}
    reward = torch.tensor([1.0, -2.0, 0.5])
    # Row 0 continues, row 1 terminated, row 2 truncated (a time limit: no entry in the target at all).
    terminated = torch.tensor([0.0, 1.0, 0.0])
    eps = torch.randn(3, 2)
    target = policy.soft_td_target(next_obs, reward, terminated, eps)

    x = policy.features(next_obs, None, None)
    a, log_prob = policy.actor.sample(x, eps)
    q = policy.critic_target(x, a)
    torch.testing.assert_close(q[1], q[0] + 3.0)
    soft_value = q[0] - 0.5 * log_prob
    torch.testing.assert_close(
        target, torch.stack([1 + 0.9 * soft_value[0], torch.tensor(-2.0), 0.5 + 0.9 * soft_value[2]])
    )

    # Through `forward`: a batch whose rows are truncated bootstraps as one that is not.
    batch = training_batch(3)
    batch[NEXT_TERMINATED] = torch.tensor([[False], [True], [False]])
    draws = {ACTOR_NOISE: torch.randn(3, 2, 2)}
    plain = policy({**batch, **draws})
    truncated = policy({**batch, **draws, NEXT_TRUNCATED: torch.tensor([[True], [False], [True]])})
    torch.testing.assert_close(plain["td_target_mean"], truncated["td_target_mean"])
    expected = policy.soft_td_target(
        {OBS_STATE: batch[OBS_STATE][:, 1]},
        batch[NEXT_REWARD][:, 0],
        torch.tensor([0.0, 1.0, 0.0]),
        draws[ACTOR_NOISE][:, 1],
    )
    torch.testing.assert_close(plain["td_target_mean"], expected.mean())


def grad_reach(loss: torch.Tensor, policy: SACPolicy) -> set[str]:
    """Names of the parameters that `loss` gives a non-zero gradient."""
    named = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], retain_graph=True, allow_unused=True)
    return {n for (n, _), g in zip(named, grads) if g is not None and bool(g.abs().sum() > 0)}


@pytest.mark.parametrize("pixels", [False, True])
def test_each_loss_moves_its_own_parameters_only(pixels):
    policy = make_policy(pixels=pixels).train()
    losses = policy.losses(training_batch(pixels=pixels))
    prefixes = lambda names: {n.split(".")[0] for n in names}  # noqa: E731 - a one-line helper
    critic = {"critic", "encoder"} if pixels else {"critic"}
    assert prefixes(grad_reach(losses["critic_loss"], policy)) == critic
    assert prefixes(grad_reach(losses["actor_loss"], policy)) == {"actor"}
    assert grad_reach(losses["alpha_loss"], policy) == {"log_alpha"}
    # The target networks are no parameters of the optimizer.
    trainable = {n.split(".")[0] for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable == critic | {"actor", "log_alpha"}


def test_one_step_on_the_sum_is_three_adam_steps():
    """A single AdamW (weight decay 0) over all parameters stepping on the summed loss, as the trainer does, gives
    the weights that three Adam optimizers give, each stepping on its own loss."""
    joint, split = make_policy(seed=3).train(), make_policy(seed=3).train()
    opt = torch.optim.AdamW(joint.parameters(), lr=1e-2, weight_decay=0.0)
    groups = {
        "critic_loss": list(split.critic.parameters()),
        "actor_loss": list(split.actor.parameters()),
        "alpha_loss": [split.log_alpha],
    }
    opts = {k: torch.optim.Adam(ps, lr=1e-2) for k, ps in groups.items()}
    for step in range(3):
        batch = {**training_batch(seed=step), ACTOR_NOISE: torch.randn(8, 2, 2)}
        opt.zero_grad()
        joint(batch)["loss"].backward()
        opt.step()
        joint.update_target()
        losses = split.losses(batch)
        # Every gradient from the weights before the step (the actor's graph reads the critics' weights).
        grads = {k: torch.autograd.grad(losses[k], ps, retain_graph=True) for k, ps in groups.items()}
        for key, params in groups.items():
            for p, g in zip(params, grads[key]):
                p.grad = g
            opts[key].step()
        split.update_target()
    for (name, a), b in zip(joint.state_dict().items(), split.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


@pytest.mark.parametrize("pixels", [False, True])
def test_target_networks_move_by_tau(pixels):
    policy = make_policy(pixels=pixels)
    online = [*policy.critic.parameters(), *(policy.encoder.parameters() if pixels else [])]
    target = [*policy.critic_target.parameters(), *(policy.encoder_target.parameters() if pixels else [])]
    for a, b in zip(online, target):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        for p in online:
            p.add_(1.0)
    before = [t.clone() for t in target]
    policy.update_target()
    for t, b in zip(target, before):
        torch.testing.assert_close(t, b + 0.005)
    actor_before = [p.clone() for p in policy.actor.parameters()]
    policy.update_target(tau=1.0)
    for a, t in zip(online, target):
        torch.testing.assert_close(t, a)
    assert all(torch.equal(a, b) for a, b in zip(policy.actor.parameters(), actor_before))


def test_random_shift_moves_images_with_replicated_edges():
    images = torch.rand(2, 3, 8, 8)
    pad = 2
    # Offset (pad, pad) is the image itself; (0, 0) moves it down-right, repeating the top row / left column.
    same = random_shift(images, pad, torch.tensor([[pad, pad], [pad, pad]]))
    torch.testing.assert_close(same, images)
    moved = random_shift(images, pad, torch.tensor([[0, 0], [2 * pad, pad]]))
    torch.testing.assert_close(moved[0, :, pad:, pad:], images[0, :, :-pad, :-pad])
    torch.testing.assert_close(moved[0, :, 0, pad:], images[0, :, 0, :-pad])
    torch.testing.assert_close(moved[1, :, :-pad], images[1, :, pad:])  # up by pad rows
    torch.testing.assert_close(moved[1, :, -1], images[1, :, -1])


def test_pixels_forward_backward_with_augmentation_in_training_only():
    policy = make_policy(pixels=True).train()
    draws = policy.draw_training_noise(6)
    assert draws[SHIFT_OFFSETS].shape == (6, 2, 2) and draws[ACTOR_NOISE].shape == (6, 2, 2)
    assert int(draws[SHIFT_OFFSETS].min()) >= 0 and int(draws[SHIFT_OFFSETS].max()) <= 8
    out = policy({**training_batch(6, pixels=True), **draws})
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    assert all(p.grad is not None for p in policy.encoder.parameters())
    assert all(p.grad is None for p in policy.encoder_target.parameters())
    assert SHIFT_OFFSETS not in policy.eval().draw_training_noise(6)
    assert SHIFT_OFFSETS not in make_policy(pixels=True, image_shift_pad=0).train().draw_training_noise(6)
    # Acting reads the unshifted images.
    actions = policy.select_action({OBS_STATE: torch.zeros(2, 3), OBS_IMAGE: torch.rand(2, 3, 16, 16)})
    assert actions.shape == (2, 2)


def test_exploration_noise_is_per_env_slot_and_seeded():
    policy = make_policy().eval()
    policy.explore = True
    obs = {OBS_STATE: torch.zeros(3, 3)}  # one observation for all: only the noise tells the slots apart

    def rollout(seed: int) -> torch.Tensor:
        policy.reset()
        policy.set_noise_seed(seed)
        return torch.stack([policy.select_action(obs) for _ in range(2)])

    first = rollout(7)
    torch.testing.assert_close(rollout(7), first)
    assert not torch.allclose(first[:, 0], first[:, 1]) and not torch.allclose(first[0], first[1])
    assert not torch.allclose(rollout(8), first)
    # Slot b of seed 7 is slot 0 of seed 7 + b; a sequence names each slot's seed.
    policy.reset()
    policy.set_noise_seed([8, 9, 7])
    torch.testing.assert_close(policy.select_action(obs), first[0][[1, 2, 0]])


def test_forward_runs_under_bf16_autocast():
    policy = make_policy(pixels=True).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = policy(training_batch(pixels=True))
    assert torch.isfinite(out["loss"]) and out["critic_loss"].dtype == torch.float32
    out["loss"].backward()


def test_config_validation():
    for bad, match in [
        (dict(n_q=0), "policy.n_q=0"),
        (dict(hidden_dims=[]), "policy.hidden_dims"),
        (dict(tau=0.0), "policy.tau=0.0"),
        (dict(discount=1.5), "policy.discount=1.5"),
        (dict(init_temperature=0.0), "policy.init_temperature"),
        (dict(n_action_steps=2), "policy.n_action_steps=2"),
        (dict(image_shift_pad=-1), "policy.image_shift_pad"),
        (dict(input_features={OBS_STATE: FeatureConfig(shape=[3], kind="state")}), "low/high"),
        (dict(pixels=True, image_encoder_layers=8), "image_encoder_layers=8"),
        (dict(input_features={"observation.task_index": FeatureConfig(shape=[], kind="task")}), "'task'"),
    ]:
        with pytest.raises(ConfigError, match=match):
            tiny_config(**bad).validate()


def test_a_discrete_or_unbounded_action_is_refused():
    """A discrete action declared as a scalar (shape []) or with unusable bounds stops at validation."""
    discrete = FeatureConfig(shape=[], kind="action", low=[0.0], high=[2.0])
    unbounded = FeatureConfig(shape=[2], kind="action", low=[-float("inf")], high=[float("inf")])
    empty = FeatureConfig(shape=[2], kind="action", low=[1.0, 0.0], high=[1.0, 1.0])
    for feature, match in [
        (discrete, "continuous action space.*shape \\[\\]"),
        (unbounded, "finite low < high"),
        (empty, "finite low < high"),
    ]:
        with pytest.raises(ConfigError, match=match):
            tiny_config(output_features={ACTION: feature}).validate()


def test_max_tanh_gaussian_entropy_by_quadrature():
    """The constant behind the target-entropy check: the largest entropy of tanh(u), u ~ N(mean, std), is at
    mean 0, std about 0.874, and just below log 2 (the uniform distribution's on [-1, 1])."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(120)
    weights = weights / weights.sum()

    def entropy(mean: float, std: float) -> float:
        u = mean + std * nodes
        log_det = 2 * (math.log(2) - u - np.logaddexp(0, -2 * u))  # log(1 - tanh(u)^2)
        return 0.5 * math.log(2 * math.pi * math.e * std**2) + float(weights @ log_det)

    best = max(entropy(m, s) for m in (0.0, 0.1, 0.3) for s in np.linspace(0.5, 1.3, 161))
    assert best == pytest.approx(MAX_TANH_GAUSSIAN_ENTROPY, abs=2e-5)
    assert entropy(0.0, 0.874) == pytest.approx(best, abs=1e-5) and best < math.log(2)


def test_target_entropy_must_be_reachable():
    """Negative targets (SAC's default is -|A|) and positive ones a tanh-Gaussian reaches are accepted; one at
    or above |A| * 0.6836 nats, or not finite, is refused in one line: the temperature would grow for ever."""
    for ok in (None, -2.0, -40.0, 0.0, 1.3):
        tiny_config(target_entropy=ok).validate()
    assert tiny_config(target_entropy=-5.0).entropy_target == -5.0
    for bad in (1.4, 2 * math.log(2), 10.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=f"policy.target_entropy={bad}.*at most 1.367 nats"):
            tiny_config(target_entropy=bad).validate()


def test_check_run_refuses_what_cannot_train_sac():
    """The start-up checks of an online run (`SACPolicy.check_run`, called by the trainer): no gradient steps,
    a zero update ratio, and an env whose action space is not a bounded Box of the declared shape."""
    policy = make_policy()

    def training(gradient_steps: int = 1, utd_ratio: float | None = None):
        return OmegaConf.create({"gradient_steps": gradient_steps, "utd_ratio": utd_ratio})

    box = spaces.Box(np.array([-2.0, 0.0], dtype=np.float32), np.array([2.0, 10.0], dtype=np.float32))
    policy.check_run(training(), box)
    policy.check_run(training(-1), box)
    policy.check_run(training(0, utd_ratio=0.5), box)  # the ratio takes precedence over gradient_steps
    with pytest.raises(
        ConfigError, match="training.gradient_steps=0: SAC would collect without ever learning"
    ):
        policy.check_run(training(0), box)
    with pytest.raises(ConfigError, match="training.utd_ratio=0"):
        policy.check_run(training(1, utd_ratio=0.0), box)
    for space, match in [
        (spaces.Discrete(3), "continuous \\(Box\\) action space; this env's is Discrete\\(3\\)"),
        (spaces.MultiDiscrete([2, 2]), "continuous \\(Box\\)"),
        (spaces.Box(0, 5, shape=(2,), dtype=np.int64), "continuous \\(Box\\)"),
        (spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32), "of shape \\[2\\]"),
        (spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32), "bounded Box"),
    ]:
        with pytest.raises(ConfigError, match=match):
            policy.check_run(training(), space)


CARTPOLE_DISCRETE = """
name: cartpole_discrete
gym_id: CartPole-v1
fps: 50
max_episode_steps: 50
features:
  observation.state: {shape: [4], kind: state, low: [-5.0], high: [5.0]}
  action: {shape: [1], kind: action, low: [0.0], high: [1.0]}
observation_keys:
  .: observation.state
"""


def test_start_up_refuses_no_updates_and_a_discrete_env_in_one_line(tmp_path, capsys):
    """Through scripts/train.py: each bad setting ends the run at start-up with exit code 2 and one line."""
    no_updates = [*TINY, "training.gradient_steps=0", "training.steps=100", f"output_dir={tmp_path / 'a'}"]
    assert train_main(no_updates) == 2
    err = capsys.readouterr().err.strip()
    assert "training.gradient_steps=0" in err and len(err.splitlines()) == 1, err
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "cartpole_discrete.yaml").write_text(CARTPOLE_DISCRETE)
    discrete = ["--config-dir", str(tmp_path), "policy=sac", "env=cartpole_discrete", "training.steps=100"]
    assert train_main([*discrete, "eval.freq=0", f"output_dir={tmp_path / 'b'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "Discrete(2)" in err and len(err.splitlines()) == 1, err


# ------------------------------------------------------------------------------------------ by hand
# A one-unit SAC whose every number is set, its losses and target step computed here with `math` alone.
HAND_ACTOR = {"w1": 1.0, "b1": 0.5, "w_mean": 0.4, "b_mean": 0.1, "w_log_std": -0.2, "b_log_std": -1.0}
# Per Q-function: first layer weights on (x, a) and bias, then the output weight and bias.
HAND_CRITIC = [(1.0, 2.0, 0.5, 1.5, -0.3), (-0.5, 1.0, 1.0, 2.0, 0.2)]
HAND_TARGET = [(0.8, 1.5, 0.2, 1.0, 0.0), (0.3, -1.0, 0.7, 0.5, 0.1)]


def hand_policy() -> SACPolicy:
    """State and action of size 1 in [-1, 1] (normalisation is the identity), hidden width 1, temperature 0.5,
    discount 0.9, the weights above."""
    unit = dict(shape=[1], low=[-1.0], high=[1.0])
    config = SACConfig(
        hidden_dims=[1],
        discount=0.9,
        init_temperature=0.5,
        input_features={OBS_STATE: FeatureConfig(kind="state", **unit)},
        output_features={ACTION: FeatureConfig(kind="action", **unit)},
    )
    policy = SACPolicy(config)
    a = HAND_ACTOR
    with torch.no_grad():
        first, last = policy.actor.net[0], policy.actor.net[2]
        first.weight.fill_(a["w1"])
        first.bias.fill_(a["b1"])
        last.weight.copy_(torch.tensor([[a["w_mean"]], [a["w_log_std"]]]))
        last.bias.copy_(torch.tensor([a["b_mean"], a["b_log_std"]]))
        for net, values in ((policy.critic.net, HAND_CRITIC), (policy.critic_target.net, HAND_TARGET)):
            for k, (wx, wa, c, v, d) in enumerate(values):
                net.weights[0][k] = torch.tensor([[wx], [wa]])
                net.biases[0][k] = c
                net.weights[1][k] = v
                net.biases[1][k] = d
    return policy


def hand_actor(x: float, eps: float) -> tuple[float, float]:
    """The action tanh(u), u = mean + std * eps, and its log-density, from the definitions."""
    a = HAND_ACTOR
    h = max(0.0, a["w1"] * x + a["b1"])
    mean = a["w_mean"] * h + a["b_mean"]
    log_std = a["w_log_std"] * h + a["b_log_std"]
    std = math.exp(log_std)
    u = mean + std * eps
    gaussian = -0.5 * ((u - mean) / std) ** 2 - math.log(std) - 0.5 * math.log(2 * math.pi)
    return math.tanh(u), gaussian - math.log(1 - math.tanh(u) ** 2)


def hand_q(params: tuple, x: float, a: float) -> float:
    wx, wa, c, v, d = params
    return v * max(0.0, wx * x + wa * a + c) + d


def test_losses_and_target_step_match_a_hand_computation():
    policy = hand_policy().train()
    x, x_next = [0.2, -0.6], [0.5, 0.1]
    action, reward, terminated = [0.3, -0.8], [1.0, -0.5], [0.0, 1.0]
    eps, eps_next = [0.5, -1.0], [-0.3, 0.8]
    batch = {
        OBS_STATE: torch.tensor([[[x[i]], [x_next[i]]] for i in range(2)]),
        ACTION: torch.tensor([[[a]] for a in action]),
        NEXT_REWARD: torch.tensor([[r] for r in reward]),
        NEXT_TERMINATED: torch.tensor([[bool(t)] for t in terminated]),
        ACTOR_NOISE: torch.tensor([[[eps[i]], [eps_next[i]]] for i in range(2)]),
    }
    alpha, discount, target_entropy = 0.5, 0.9, -1.0
    targets = []
    for i in range(2):
        a_next, log_prob_next = hand_actor(x_next[i], eps_next[i])
        q_next = min(hand_q(p, x_next[i], a_next) for p in HAND_TARGET)
        targets.append(reward[i] + discount * (1 - terminated[i]) * (q_next - alpha * log_prob_next))
    critic_loss = 0.5 * sum(
        sum((hand_q(p, x[i], action[i]) - targets[i]) ** 2 for i in range(2)) / 2 for p in HAND_CRITIC
    )
    drawn = [hand_actor(x[i], eps[i]) for i in range(2)]
    actor_loss = (
        sum(alpha * lp - min(hand_q(p, x[i], a) for p in HAND_CRITIC) for i, (a, lp) in enumerate(drawn)) / 2
    )
    alpha_loss = -sum(math.log(alpha) * (lp + target_entropy) for _, lp in drawn) / 2

    out = policy.losses(batch)
    torch.testing.assert_close(out["td_target_mean"], torch.tensor(sum(targets) / 2))
    torch.testing.assert_close(out["critic_loss"], torch.tensor(critic_loss))
    torch.testing.assert_close(out["actor_loss"], torch.tensor(actor_loss))
    torch.testing.assert_close(out["alpha_loss"], torch.tensor(alpha_loss))
    torch.testing.assert_close(out["entropy"], torch.tensor(-(drawn[0][1] + drawn[1][1]) / 2))
    # The temperature's gradient: d alpha_loss / d log_alpha = -mean(log pi + target entropy).
    (grad,) = torch.autograd.grad(out["alpha_loss"], policy.log_alpha)
    torch.testing.assert_close(grad, torch.tensor(-sum(lp + target_entropy for _, lp in drawn) / 2))

    # The target step: target <- 0.995 target + 0.005 online, every weight of both Q-functions.
    policy.update_target()
    net = policy.critic_target.net
    for k, (online, target) in enumerate(zip(HAND_CRITIC, HAND_TARGET)):
        moved = [0.995 * t + 0.005 * o for o, t in zip(online, target)]
        got = [*net.weights[0][k].flatten().tolist(), net.biases[0][k].item(), net.weights[1][k].item()]
        got.append(net.biases[1][k].item())
        assert got == pytest.approx(moved, rel=1e-6)  # float32 weights: relative, whatever the CPU


# ------------------------------------------------------------------------------------ end to end
TINY = [
    "policy=sac",
    "env=pendulum",
    "env.max_episode_steps=50",
    "policy.hidden_dims=[32,32]",
    "training.batch_size=32",
    "training.n_envs=2",
    "training.learning_starts=50",
    "training.log_freq=50",
    "training.save_freq=100",
    "eval.freq=100",
    "eval.n_episodes=2",
    "eval.batch_size=2",
    "eval.max_episodes_rendered=0",
    "eval.use_async_envs=false",
]


def records(run_dir: Path, split: str) -> list[dict]:
    with open(run_dir / "metrics.jsonl") as f:
        return [r for r in (json.loads(line) for line in f) if r["split"] == split]


def test_train_resume_and_eval(tmp_path):
    run_dir = tmp_path / "run"
    assert (
        train_main([*TINY, "training.steps=200", "training.save_buffer=true", f"output_dir={run_dir}"]) == 0
    )
    state = load_training_state(latest_checkpoint(run_dir))
    # One update per vector step (2 transitions) after the first 50 transitions.
    assert state["transitions"] == 200 and state["updates"] == 75
    train = records(run_dir, "train")
    assert {"loss", "critic_loss", "actor_loss", "alpha_loss", "alpha", "entropy", "grad_norm"} <= set(
        train[-1]
    )
    assert all(math.isfinite(r["loss"]) for r in train if "loss" in r)
    assert train[-1]["alpha"] < 1.0  # the temperature is learned
    assert [r["step"] for r in records(run_dir, "eval")] == [100, 200]

    assert train_main([*TINY, "training.steps=300", "training.resume=true", f"output_dir={run_dir}"]) == 0
    state = load_training_state(latest_checkpoint(run_dir))
    assert state["transitions"] == 300 and state["updates"] == 125

    policy, cfg = load_run_policy(latest_checkpoint(run_dir))
    assert cfg.policy.name == "sac" and isinstance(policy, SACPolicy) and not policy.explore
    action = policy.select_action({OBS_STATE: torch.tensor([[1.0, 0.0, 0.0]])})
    assert action.shape == (1, 1) and -2 <= float(action) <= 2

    info = evaluate_run(run_dir, tmp_path / "eval")
    assert len(info["per_episode"]) == 2 and all(ep["n_steps"] == 50 for ep in info["per_episode"])


def test_train_from_pixels(tmp_path):
    """Online SAC from a camera and a state (a toy env with a nested camera dict): acting, replay of images and
    DrQ-augmented updates through the trainer."""
    text = (REPO_ROOT / "tests" / "configs" / "env" / "nested_pixels.yaml").read_text()
    bounded = text.replace(
        "{shape: [2], kind: state}", "{shape: [2], kind: state, low: [0.0, 0.0], high: [4.0, 8.0]}"
    )
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "nested_pixels_bounded.yaml").write_text(
        bounded.replace("name: nested_pixels", "name: nested_pixels_bounded")
    )
    overrides = [
        "policy=sac",
        "env=nested_pixels_bounded",
        "policy.hidden_dims=[16]",
        "policy.image_encoder_layers=2",
        "policy.image_encoder_channels=4",
        "training.batch_size=8",
        "training.learning_starts=10",
        "training.steps=30",
        "training.log_freq=30",
        "eval.freq=0",
        f"output_dir={tmp_path / 'run'}",
    ]
    assert train_main(["--config-dir", str(tmp_path), *overrides]) == 0
    (train,) = records(tmp_path / "run", "train")
    assert train["updates"] == 20 and math.isfinite(train["loss"])
    policy, _ = load_run_policy(latest_checkpoint(tmp_path / "run"))
    action = policy.select_action(
        {"observation.images.top": torch.rand(1, 3, 12, 16), OBS_STATE: torch.zeros(1, 2)}
    )
    assert action.shape == (1, 2)


def test_sac_learns_pendulum(tmp_path):
    """4,000 transitions of a small SAC (RL Zoo's Pendulum rate, 1e-3) swing the pendulum up: far above the
    return of uniformly random actions on the same evaluation episodes (about -1,300; SAC reached -209 to -451
    over seeds 0-6). About 25 s on one core."""
    run_dir = tmp_path / "run"
    overrides = [
        "policy=sac",
        "env=pendulum",
        "seed=1",
        "policy.hidden_dims=[64,64]",
        "policy.optimizer_lr=1e-3",
        "training.batch_size=64",
        "training.steps=4000",
        "training.learning_starts=200",
        "training.grad_clip_norm=inf",
        "training.log_freq=1000",
        "eval.freq=4000",
        "eval.n_episodes=10",
        "eval.batch_size=10",
        "eval.max_episodes_rendered=0",
        "eval.use_async_envs=false",
    ]
    assert train_main([*overrides, f"output_dir={run_dir}"]) == 0
    (sac,) = records(run_dir, "eval")
    argv = ["policy=random", "env=pendulum", "eval.n_episodes=10", "eval.batch_size=10"]
    assert eval_main([*argv, "eval.max_episodes_rendered=0", "--output-dir", str(tmp_path / "random")]) == 0
    random_return = json.loads((tmp_path / "random" / "eval_info.json").read_text())["aggregated"][
        "avg_sum_reward"
    ]
    assert sac["avg_sum_reward"] > random_return + 500, (sac["avg_sum_reward"], random_return)
