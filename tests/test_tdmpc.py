"""TD-MPC: planner shapes/bounds/determinism/batch independence, per-env reset, losses and target update."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from einops import einsum

from lerobot.config import FeatureConfig
from lerobot.constants import (
    ACTION,
    FROM_DEMONSTRATIONS,
    NEXT_REWARD,
    OBS_ENV_STATE,
    OBS_STATE,
    SAMPLE_PRIORITY,
    SAMPLE_WEIGHT,
)
from lerobot.errors import ConfigError
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.policies.tdmpc import TDMPCConfig, TDMPCPolicy, networks
from lerobot.policies.tdmpc import planner as planner_module
from lerobot.policies.tdmpc.modeling import NEXT_TERMINATED

# PushT-like bounds: pixels 0..512, so unnormalisation is visible (not symmetric around 0).
FEATURES_IN = {
    OBS_STATE: FeatureConfig(shape=[2], kind="state", low=[0.0, 0.0], high=[512.0, 512.0]),
    OBS_ENV_STATE: FeatureConfig(shape=[4], kind="env_state", low=[0.0], high=[512.0]),
}
FEATURES_OUT = {ACTION: FeatureConfig(shape=[2], kind="action", low=[0.0, 100.0], high=[512.0, 200.0])}


def tiny_config(**kw) -> TDMPCConfig:
    defaults = dict(
        latent_dim=16,
        enc_dim=32,
        mlp_dim=32,
        n_q=3,
        n_q_min=2,
        horizon=3,
        iterations=2,
        num_samples=16,
        num_elites=4,
        num_pi_trajs=2,
        input_features=FEATURES_IN,
        output_features=FEATURES_OUT,
    )
    defaults.update(kw)
    return TDMPCConfig(**defaults)


def make_policy(seed: int = 0, **kw) -> TDMPCPolicy:
    torch.manual_seed(seed)
    policy = TDMPCPolicy(tiny_config(**kw))
    # Non-zero Q and reward heads, so that planning has something to optimise.
    with torch.no_grad():
        policy.model.q_ensemble.weights[-1].normal_(0, 0.5)
        policy.model.reward_head[-1].weight.normal_(0, 0.5)
    return policy.eval()


def observations(batch_size: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        OBS_STATE: torch.rand(batch_size, 2, generator=g) * 512,
        OBS_ENV_STATE: torch.rand(batch_size, 4, generator=g) * 512,
    }


def test_tdmpc_is_an_online_policy():
    policy = make_policy(horizon=4)
    assert isinstance(policy, OnlinePolicy)
    assert policy.replay_horizon == 4 and policy.explore is False


def test_plan_shapes_and_bounds():
    policy = make_policy()
    obs = {k: v.unsqueeze(1) for k, v in observations(5).items()}  # (B, n_obs_steps=1, D)
    chunk = policy.predict_action_chunk(obs)
    assert chunk.shape == (5, 3, 2)
    assert torch.all(chunk[..., 0] >= 0) and torch.all(chunk[..., 0] <= 512)
    assert torch.all(chunk[..., 1] >= 100) and torch.all(chunk[..., 1] <= 200)
    action = policy.select_action(observations(5))
    assert action.shape == (5, 2)
    policy.explore = True
    explored = policy.select_action(observations(5))
    assert torch.all(explored[:, 1] >= 100) and torch.all(explored[:, 1] <= 200)


def test_plan_is_deterministic_under_a_seed():
    a, b = make_policy(), make_policy()
    obs = observations(4)
    for policy in (a, b):
        policy.set_noise_seed(7)
    plans_a = [a.select_action(obs) for _ in range(3)]
    plans_b = [b.select_action(obs) for _ in range(3)]
    for x, y in zip(plans_a, plans_b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    c = make_policy()
    c.set_noise_seed(8)
    assert not torch.allclose(c.select_action(obs), plans_a[0])
    # reset() reseeds: the first plan after it is the first plan of the seed again.
    a.reset()
    torch.testing.assert_close(a.select_action(obs), plans_a[0], rtol=0, atol=0)


def test_batch_independence_with_warm_start():
    """Planning B envs together gives each env what planning it alone (same seed) would, call after call."""
    seeds = [11, 12, 13]
    obs_seq = [observations(3, seed=s) for s in range(4)]
    together = make_policy()
    together.set_noise_seed(seeds)
    batched = [together.select_action(o) for o in obs_seq]  # 4 calls, warm-started from the previous plan
    for b, seed in enumerate(seeds):
        alone = make_policy()
        alone.set_noise_seed([seed])
        for t, o in enumerate(obs_seq):
            single = alone.select_action({k: v[b : b + 1] for k, v in o.items()})
            torch.testing.assert_close(single[0], batched[t][b], rtol=1e-4, atol=1e-3)


def test_per_env_reset_and_subset_refill():
    """n_action_steps=2 with one env reset mid-chunk: the planner refills only that env, from its own state."""
    obs_seq = [observations(2, seed=s) for s in range(3)]

    def run(policy, obs_list, reset_at_1=None):
        out = []
        for t, o in enumerate(obs_list):
            if t == 1 and reset_at_1 is not None:
                policy.reset(reset_at_1)
            out.append(policy.select_action(o))
        return out

    both = make_policy(n_action_steps=2)
    both.set_noise_seed([5, 6])
    actions = run(both, obs_seq, reset_at_1=[1])  # env 1 restarts at step 1; env 0 keeps its queue
    env0 = make_policy(n_action_steps=2)
    env0.set_noise_seed([5])
    ref0 = run(env0, [{k: v[:1] for k, v in o.items()} for o in obs_seq])
    env1 = make_policy(n_action_steps=2)
    env1.set_noise_seed([6])
    ref1 = run(env1, [{k: v[1:] for k, v in o.items()} for o in obs_seq], reset_at_1=[0])
    for t in range(3):
        torch.testing.assert_close(actions[t][0], ref0[t][0], rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(actions[t][1], ref1[t][0], rtol=1e-4, atol=1e-3)


@pytest.fixture
def one_thread():
    """Torch on one thread (the planner then evaluates candidates in blocks), restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference_plan(policy: TDMPCPolicy, z: torch.Tensor, gen: torch.Generator, prev: torch.Tensor | None):
    """MPPI for one env, written out plainly with the model's own modules: z (L,) -> (plan (H, A), mean (H, A)).

    The planner's documented noise order from this env's generator: Gaussian numbers for every iteration's
    samples, then the policy trajectories, then the exploration noise; then the elite draw's uniforms.
    `prev` is the env's last mean plan (None after a reset).
    """
    cfg, model = policy.config, policy.model
    n_s, n_pi, n_el, horizon, a_dim = (
        cfg.num_samples,
        cfg.num_pi_trajs,
        cfg.num_elites,
        cfg.planning_horizon,
        policy.action_dim,
    )
    gauss = torch.randn((cfg.iterations * n_s + n_pi + 1) * horizon * a_dim, generator=gen)
    unif = torch.rand(n_el, generator=gen)
    eps = gauss[: cfg.iterations * n_s * horizon * a_dim].view(cfg.iterations, n_s, horizon, a_dim)
    eps_pi = gauss[eps.numel() : eps.numel() + n_pi * horizon * a_dim].view(n_pi, horizon, a_dim)

    pi_actions = torch.zeros(n_pi, horizon, a_dim)
    zp = z.expand(n_pi, -1)
    for t in range(horizon):
        if cfg.prior_entropy_coeff > 0:  # a draw from the Gaussian prior with the same noise
            pi_actions[:, t] = model.pi_sample(zp, eps_pi[:, t])[0]
        else:
            pi_actions[:, t] = (model.pi(zp) + cfg.min_std * eps_pi[:, t]).clamp(-1, 1)
        zp = model.next(zp, pi_actions[:, t])

    mean = torch.zeros(horizon, a_dim)
    if prev is not None:
        mean[:-1] = prev[1:]
    std = torch.full_like(mean, cfg.max_std)
    for i in range(cfg.iterations):
        actions = torch.cat([(mean + std * eps[i]).clamp(-1, 1), pi_actions])  # (N, H, A)
        zs, value, discount = z.expand(len(actions), -1), torch.zeros(len(actions)), 1.0
        for t in range(horizon):
            value = value + discount * model.reward(zs, actions[:, t])
            zs = model.next(zs, actions[:, t])
            discount *= cfg.discount
        value = value + discount * model.q(zs, model.pi(zs)).mean(dim=0)
        elite_value, elite_idx = value.topk(n_el)
        elites = actions[elite_idx]  # (K, H, A)
        score = torch.softmax(cfg.temperature * elite_value, dim=0)
        new_mean = einsum(score[None], elites[None], "b k, b k h a -> b h a")[0]
        var = einsum(score[None], (elites - new_mean) ** 2, "b k, k h a -> b h a")[0]
        std = var.sqrt().clamp(cfg.min_std, cfg.max_std)
        mean = cfg.momentum * mean + (1 - cfg.momentum) * new_mean
    gumbel = -torch.log(-torch.log(unif.clamp(1e-20, 1 - 1e-7)))
    choice = (score.clamp_min(1e-30).log() + gumbel).argmax()
    return elites[choice], mean


# 60 samples + 4 policy trajectories: 64 candidate rows per env, so one env alone and several together run
# the same kernels on the same row layout (equal on this project's CPUs; relative tolerances keep the tests
# free of any BLAS's row-blocking choices).
ROWS64 = dict(num_samples=60, num_pi_trajs=4, num_elites=8)


@pytest.mark.parametrize(
    "plan_action,prior_entropy_coeff", [("elite", 0.0), ("mean", 0.0), ("elite", 1e-4), ("mean", 1e-4)]
)
def test_planner_matches_a_per_env_reference(one_thread, plan_action, prior_entropy_coeff):
    """Batched planning of 3 envs (own seeds, warm starts, env 1 reset at call 2) == one env at a time; the
    executed action is the drawn elite's or the final mean's first step, as `plan_action` says; with the
    deterministic prior and with the Gaussian one."""
    seeds = [21, 22, 23]
    policy = make_policy(**ROWS64, plan_action=plan_action, prior_entropy_coeff=prior_entropy_coeff)
    policy.set_noise_seed(seeds)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    prev: list[torch.Tensor | None] = [None] * 3
    for call in range(4):
        if call == 2:
            policy.reset([1])
            prev[1] = None
        obs = observations(3, seed=call)
        batched = policy.select_action(obs)
        with torch.no_grad():
            z = policy.model.encode(policy.encode_observation(obs))
            for b in range(3):
                plan, prev[b] = reference_plan(policy, z[b], gens[b], prev[b])
                executed = plan if plan_action == "elite" else prev[b]
                expected = policy.normalizer.unnormalize(ACTION, executed[0])
                torch.testing.assert_close(batched[b], expected, rtol=1e-4, atol=1e-3)


def test_batch_composition_does_not_change_an_env(one_thread):
    """An env's actions do not depend on which other envs share its planning calls, nor on its slot."""
    obs_seq = [observations(4, seed=s) for s in range(3)]
    four = make_policy(**ROWS64)
    four.set_noise_seed([31, 32, 33, 34])
    two = make_policy(**ROWS64)
    two.set_noise_seed([33, 31])  # env of seed 33 in slot 0, env of seed 31 in slot 1
    for obs in obs_seq:
        a4 = four.select_action(obs)
        a2 = two.select_action({k: v[[2, 0]] for k, v in obs.items()})
        torch.testing.assert_close(a2, a4[[2, 0]], rtol=1e-4, atol=1e-3)


def test_episode_streams_replace_the_slot_seeds(one_thread):
    """Given episode streams (`reset(..., episode_seeds=...)`, as evaluation does), an env's plans follow its
    episode's seed, not its slot: the episode of seed 8 plans the same in slot 2 of 3 as in slot 0 alone,
    and a slot's own planner seed no longer matters."""
    obs_seq = [observations(3, seed=s) for s in range(3)]
    three = make_policy(**ROWS64)
    three.reset(episode_seeds=[6, 7, 8])
    alone = make_policy(**ROWS64)
    alone.set_noise_seed(99)
    alone.reset(episode_seeds=[8])
    for obs in obs_seq:
        a3 = three.select_action(obs)
        a1 = alone.select_action({k: v[2:] for k, v in obs.items()})
        torch.testing.assert_close(a1, a3[2:], rtol=1e-4, atol=1e-3)
    other = make_policy(**ROWS64)
    other.reset(episode_seeds=[9])
    assert not torch.allclose(other.select_action({k: v[2:] for k, v in obs_seq[0].items()}), a1)


@pytest.mark.parametrize("value_bins", [0, 11])
def test_blocked_values_are_bit_identical(one_thread, monkeypatch, value_bins):
    """Candidate values computed in blocks == all rows at once == the model's modules on the whole batch (to
    float rounding: row blocking may change a BLAS kernel's choice on other CPUs); with scalar heads and with
    two-hot bins decoded to scalars."""
    policy = make_policy(value_bins=value_bins)
    model, planner = policy.model, policy.planner
    g = torch.Generator().manual_seed(3)
    n_rows, horizon = 300, policy.config.planning_horizon
    z = model.encode(torch.rand(n_rows, policy.obs_dim, generator=g) * 2 - 1)
    actions = torch.rand(n_rows, horizon, policy.action_dim, generator=g) * 2 - 1
    with torch.no_grad():
        monkeypatch.setattr(planner_module, "ROWS_PER_BLOCK", 64)
        assert len(planner_module.block_bounds(n_rows, 64)) == 4
        blocked = planner.estimate_value(model, z, actions)
        monkeypatch.setattr(planner_module, "ROWS_PER_BLOCK", 10**9)
        whole = planner.estimate_value(model, z, actions)
        zs, expected, discount = z, torch.zeros(n_rows), 1.0
        for t in range(horizon):
            expected = expected + discount * model.reward(zs, actions[:, t])
            zs = model.next(zs, actions[:, t])
            discount *= policy.config.discount
        expected = expected + discount * model.q(zs, model.pi(zs)).mean(dim=0)
    torch.testing.assert_close(blocked, whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(whole, expected, rtol=1e-5, atol=1e-6)


def test_plan_pessimism_lowers_a_value_by_the_ensembles_spread():
    """With `plan_pessimism=k` a candidate's value is the plain one less k * discount**H times the std of the
    members' terminal Q; a plan differs once the penalty reorders the candidates."""
    k = 2.0
    plain, pessimistic = make_policy(), make_policy(plan_pessimism=k)
    model, horizon = plain.model, plain.config.planning_horizon
    g = torch.Generator().manual_seed(5)
    z = model.encode(torch.rand(40, plain.obs_dim, generator=g) * 2 - 1)
    actions = torch.rand(40, horizon, plain.action_dim, generator=g) * 2 - 1
    with torch.no_grad():
        zs = z
        for t in range(horizon):
            zs = model.next(zs, actions[:, t])
        spread = model.q(zs, model.pi(zs)).std(dim=0)
        assert bool((spread > 1e-3).all())
        expected = (
            plain.planner.estimate_value(model, z, actions) - k * plain.config.discount**horizon * spread
        )
        got = pessimistic.planner.estimate_value(pessimistic.model, z, actions)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    plain.set_noise_seed(0)
    pessimistic.set_noise_seed(0)
    obs = observations(8)
    assert not torch.allclose(plain.select_action(obs), pessimistic.select_action(obs))


def test_elu_is_torch_elu_in_value_and_gradient():
    """The exp-based ELU equals F.elu to float rounding (positives exactly), in place and with autograd."""
    special = [0.0, -0.0, -1e-8, -1e-4, -30.0, 1e-30, 90.0, float("inf"), float("-inf")]
    x = torch.cat([torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3, torch.tensor(special)])
    leaf = x.clone().requires_grad_()
    out = networks.elu(leaf)
    torch.testing.assert_close(out.double(), F.elu(x.double()), rtol=0, atol=1e-7)
    assert torch.equal(out[x > 0], x[x > 0])
    out.backward(torch.linspace(-2, 2, len(x)))
    ref_leaf = x.clone().requires_grad_()
    F.elu(ref_leaf).backward(torch.linspace(-2, 2, len(x)))
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-6, atol=1e-7)
    y = x.clone()
    assert networks.elu_(y) is y and torch.equal(y, out.detach())
    assert networks.elu(torch.tensor([float("nan")])).isnan().all()


def test_mish_networks_act_as_they_train():
    """`activation="mish"` (TD-MPC2): every hidden layer is Mish; acting's in-place paths (`mlp_inference`,
    `forward_inference`) equal the training modules exactly, and planning's values equal the model's."""
    policy = make_policy(activation="mish")
    model = policy.model
    assert all(not isinstance(m, networks.ELU) for m in model.modules())
    assert sum(isinstance(m, torch.nn.Mish) for m in model.modules()) == 1 + 2 * 3 + 1  # + the Q ensemble's
    x = torch.rand(50, model.dynamics[0].in_features, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        h = F.linear(x, model.dynamics[0].weight, model.dynamics[0].bias)
        h = F.mish(F.layer_norm(h, h.shape[-1:], model.dynamics[1].weight, model.dynamics[1].bias))
        assert torch.equal(model.dynamics[:3](x), h)
        assert torch.equal(networks.mlp_inference(model.dynamics, x), model.dynamics(x))
        assert torch.equal(model.q_ensemble.forward_inference(x), model.q_ensemble(x))
    assert not torch.equal(make_policy().model.dynamics(x), model.dynamics(x))  # ELU differs
    obs = observations(2)
    assert policy.select_action(obs).shape == (2, 2)


def test_q_dropout_drops_first_layer_units_in_updates_only():
    """`q_dropout` (TD-MPC2: 0.01) is dropout on the Q members' first hidden layer before its LayerNorm, in
    training mode; eval mode, acting and the target network (which stays in eval mode) never drop."""
    policy = make_policy(q_dropout=0.5).train()
    assert not policy.model_target.training and policy.model.q_ensemble.training
    q = policy.model.q_ensemble
    x = torch.rand(8, q.weights[0].shape[1], generator=torch.Generator().manual_seed(0))
    torch.manual_seed(5)
    out = q(x)
    torch.manual_seed(5)
    h = F.dropout(networks.member_linear(x.expand(q.n, -1, -1), q.weights[0], q.biases[0]), 0.5)
    for i in (0, 1):
        if i:
            h = networks.member_linear(h, q.weights[i], q.biases[i])
        h = F.layer_norm(h, h.shape[-1:]) * q.ln_weights[i].unsqueeze(1) + q.ln_biases[i].unsqueeze(1)
        h = networks.elu(h)
    torch.testing.assert_close(out, networks.member_linear(h, q.weights[2], q.biases[2]))
    assert not torch.equal(q(x), q(x))  # a new mask each call
    policy.eval()
    with torch.no_grad():
        assert torch.equal(q(x), q(x)) and torch.equal(q(x), q.forward_inference(x))
    # TD targets come from the target network in eval mode: training mode gives the eval-mode targets.
    batch = training_batch()
    torch.manual_seed(1)
    in_eval = policy.eval()(batch)["td_target_mean"]
    torch.manual_seed(1)
    assert torch.equal(policy.train()(batch)["td_target_mean"], in_eval)


def test_policy_q_reduction_and_the_percentile_q_scale():
    """The policy objective takes the min or (TD-MPC2) the mean of the drawn Qs; the Q scale tracks mean |Q|
    or (TD-MPC2) the 5th-95th percentile range of the first step's Q over the batch, at least 1."""
    batch = training_batch()
    for reduction in ("min", "mean"):
        policy = make_policy(n_q=2, n_q_min=2, policy_q_reduction=reduction)  # both members drawn
        out = policy(batch)  # eval mode: q_scale stays 1
        with torch.no_grad():
            obs = policy.encode_observation({k: batch[k] for k in policy.obs_keys})
            action = policy.normalizer.normalize(ACTION, batch[ACTION])
            zs = [policy.model.encode(obs[:, 0])]
            for t in range(3):
                zs.append(policy.model.next(zs[-1], action[:, t]))
            z = torch.stack(zs, dim=1)
            q = policy.model.q(z, policy.model.pi(z))  # (2, B, 4)
        q = q.min(dim=0).values if reduction == "min" else q.mean(dim=0)
        want = -(0.5 ** torch.arange(4.0) * q.mean(dim=0)).sum() / 4
        torch.testing.assert_close(out["policy_loss"], want, rtol=1e-5, atol=1e-6)
    policy = make_policy(q_scale_stat="percentile_range")
    q_pi = torch.zeros(101, 4)
    q_pi[:, 0] = torch.arange(101.0) * 0.5  # percentiles 2.5 and 47.5
    torch.testing.assert_close(policy._q_scale_statistic(q_pi), torch.tensor(45.0))
    assert float(policy._q_scale_statistic(q_pi * 0.01)) == 1.0  # a range under 1 counts as 1
    assert float(make_policy()._q_scale_statistic(-q_pi)) == pytest.approx(q_pi.abs().mean().item())
    # A training-mode update moves the scale 1% of the way (q_scale_momentum 0.99) to that statistic.
    policy = make_policy(n_q=2, n_q_min=2, q_scale_stat="percentile_range").train()
    with torch.no_grad():
        policy.model.q_ensemble.weights[-1].mul_(50.0)  # a spread well above 1
    policy(batch)
    with torch.no_grad():
        obs = policy.encode_observation({k: batch[k] for k in policy.obs_keys})
        z = policy.model.encode(obs[:, 0])
        q0 = policy.model.q(z, policy.model.pi(z)).min(dim=0).values  # (B,) the first step's Q
    spread = (q0.quantile(0.95) - q0.quantile(0.05)).clamp_min(1.0)
    assert spread > 2.0
    torch.testing.assert_close(policy.q_scale, 1.0 + 0.01 * (spread - 1.0))


def test_block_bounds_cover_the_rows_in_aligned_blocks():
    for n_rows in (1, 36, 64, 136, 544, 1000, 6800, 13600):
        bounds = planner_module.block_bounds(n_rows, 512)
        sizes = [stop - start for start, stop in bounds]
        assert bounds[0][0] == 0 and bounds[-1][1] == n_rows
        assert all(a[1] == b[0] for a, b in zip(bounds[:-1], bounds[1:]))
        assert all(size % planner_module.ROW_ALIGN == 0 for size in sizes[:-1])
        assert len(sizes) == 1 or sizes[-1] >= planner_module.MIN_BLOCK_ROWS


def training_batch(batch_size: int = 8, horizon: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        OBS_STATE: torch.rand(batch_size, horizon + 1, 2, generator=g) * 512,
        OBS_ENV_STATE: torch.rand(batch_size, horizon + 1, 4, generator=g) * 512,
        ACTION: torch.stack(
            [
                torch.rand(batch_size, horizon, generator=g) * 512,
                100 + torch.rand(batch_size, horizon, generator=g) * 100,
            ],
            dim=-1,
        ),
        NEXT_REWARD: torch.randn(batch_size, horizon, generator=g),
        NEXT_TERMINATED: torch.zeros(batch_size, horizon, dtype=torch.bool),
    }


@pytest.mark.parametrize("absorbing,exponent", [(False, 1.0), (True, 1.0), (True, 4.0)])
def test_losses_match_closed_form_at_init(absorbing, exponent):
    """Fresh model: reward head and Q outputs are 0, Q set to a constant c, so the losses have closed forms.

    A terminated step bootstraps from nothing, or with `absorbing_terminal` from r / (1 - discount); the
    model and value learn from r ** reward_exponent.
    """
    torch.manual_seed(0)
    policy = TDMPCPolicy(
        tiny_config(discount=0.9, rho=0.5, absorbing_terminal=absorbing, reward_exponent=exponent)
    )
    c = 2.0
    with torch.no_grad():
        for model in (policy.model, policy.model_target):
            model.q_ensemble.biases[-1].fill_(c)  # last weights are zero: Q == c everywhere
    batch = training_batch()
    if exponent != 1.0:  # an exponent needs rewards in [0, 1], as PushT's
        batch[NEXT_REWARD] = batch[NEXT_REWARD].sigmoid()
    batch[NEXT_TERMINATED][:4, -1] = True  # terminations stop bootstrapping
    out = policy(batch)
    r, term = batch[NEXT_REWARD] ** exponent, batch[NEXT_TERMINATED].float()
    w = 0.5 ** torch.arange(3.0)
    v_end = r / (1 - 0.9) if absorbing else torch.zeros_like(r)
    td = r + 0.9 * ((1 - term) * c + term * v_end)
    value = (w * (3 * (c - td) ** 2).mean(0)).sum() / 3  # summed over the n_q=3 members
    reward = (w * (r**2).mean(0)).sum() / 3
    torch.testing.assert_close(out["value_loss"], value)
    torch.testing.assert_close(out["reward_loss"], reward)
    torch.testing.assert_close(out["td_target_mean"], td.mean())
    # Policy objective: -Q / max(|Q| scale, 1) weighted by rho over H+1 latents.
    scale = max(float(policy.q_scale), 1.0)
    w_pi = 0.5 ** torch.arange(4.0)
    torch.testing.assert_close(out["policy_loss"], -(w_pi * c / scale).sum() / 4)


def test_sample_weights_weigh_the_model_terms_and_priorities_are_td_errors():
    """Prioritised replay: `sample_weight` turns the consistency, reward and value terms into weighted batch
    means (the policy term stays plain) and the output's `sample_priority` is TD-MPC's, sum over t of rho**t
    times sum over the ensemble of |Q - td_target|: in closed form with Q == c, as above."""
    torch.manual_seed(0)
    policy = TDMPCPolicy(tiny_config(discount=0.9, rho=0.5)).eval()  # eval: the Q scale stays put
    c = 2.0
    with torch.no_grad():
        for model in (policy.model, policy.model_target):
            model.q_ensemble.biases[-1].fill_(c)
    batch = training_batch()
    weight = torch.rand(batch[NEXT_REWARD].shape[0], generator=torch.Generator().manual_seed(3))
    plain, weighted = policy(batch), policy({**batch, SAMPLE_WEIGHT: weight})
    assert SAMPLE_PRIORITY not in plain
    r = batch[NEXT_REWARD]
    w = 0.5 ** torch.arange(3.0)
    td = r + 0.9 * c
    torch.testing.assert_close(weighted[SAMPLE_PRIORITY], (w * 3 * (c - td).abs()).sum(dim=1))
    torch.testing.assert_close(weighted["value_loss"], (weight * (w * 3 * (c - td) ** 2).sum(1) / 3).mean())
    torch.testing.assert_close(weighted["reward_loss"], (weight * (w * r**2).sum(1) / 3).mean())
    torch.testing.assert_close(weighted["policy_loss"], plain["policy_loss"])
    # Weights of one give the plain losses.
    ones = policy({**batch, SAMPLE_WEIGHT: torch.ones_like(weight)})
    for key in ("loss", "consistency_loss", "reward_loss", "value_loss"):
        torch.testing.assert_close(ones[key], plain[key])


def test_reward_exponent_needs_rewards_in_the_unit_interval():
    with pytest.raises(ConfigError, match="reward_exponent"):
        tiny_config(reward_exponent=0.0).validate()
    policy = TDMPCPolicy(tiny_config(reward_exponent=4.0))
    batch = training_batch()  # rewards drawn from a standard normal: some negative
    with pytest.raises(ValueError, match=r"needs rewards in \[0, 1\].*reward_exponent=1"):
        policy(batch)


def test_forward_backward_and_gradient_isolation():
    policy = TDMPCPolicy(tiny_config()).train()
    out = policy(training_batch())
    assert set(out) >= {"loss", "consistency_loss", "reward_loss", "value_loss", "policy_loss"}
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    for name, p in policy.model.named_parameters():
        assert p.grad is not None, name
    assert all(p.grad is None for p in policy.model_target.parameters())

    # The policy term trains pi alone (Q weights and latents are detached).
    only_pi = TDMPCPolicy(tiny_config(consistency_coeff=0.0, reward_coeff=0.0, value_coeff=0.0)).train()
    with torch.no_grad():
        only_pi.model.q_ensemble.weights[-1].normal_()
    only_pi(training_batch())["loss"].backward()
    grads = {n: (p.grad is not None and p.grad.abs().sum() > 0) for n, p in only_pi.model.named_parameters()}
    assert any(v for n, v in grads.items() if n.startswith("pi_head"))
    assert not any(v for n, v in grads.items() if not n.startswith("pi_head"))


def test_bc_term_pulls_pi_toward_the_demonstration_rows_only():
    """bc_coeff * rho-weighted (pi(z_t) - a_t)^2 over the rows marked as demonstrations; it trains pi alone,
    and rows not marked (or a batch without the mask) add nothing."""
    torch.manual_seed(0)
    cfg = dict(consistency_coeff=0.0, reward_coeff=0.0, value_coeff=0.0, policy_coeff=0.0, rho=0.5)
    policy = TDMPCPolicy(tiny_config(bc_coeff=0.4, **cfg)).train()
    batch = training_batch()
    demo = torch.arange(len(batch[ACTION])) % 2 == 1
    out = policy({**batch, FROM_DEMONSTRATIONS: demo})
    with torch.no_grad():
        obs = policy.encode_observation({k: batch[k] for k in policy.obs_keys})
        z = policy.model.encode(obs[:, 0])
        action = policy.normalizer.normalize(ACTION, batch[ACTION])
        err = []
        for t in range(action.shape[1]):
            err.append(((policy.model.pi(z) - action[:, t]) ** 2).mean(dim=1)[demo].mean())
            z = policy.model.next(z, action[:, t])
    want = (0.5 ** torch.arange(3.0) * torch.stack(err)).sum() / 3
    torch.testing.assert_close(out["bc_loss"], want)
    torch.testing.assert_close(out["loss"], 0.4 * want)
    out["loss"].backward()
    grads = {n: p.grad is not None and p.grad.abs().sum() > 0 for n, p in policy.model.named_parameters()}
    assert any(v for n, v in grads.items() if n.startswith("pi_head"))
    assert not any(v for n, v in grads.items() if not n.startswith("pi_head"))

    # Only the marked rows count: changing an unmarked row's actions leaves the term as it was.
    changed = {**batch, ACTION: batch[ACTION].clone(), FROM_DEMONSTRATIONS: demo}
    changed[ACTION][~demo] = 0.0
    torch.testing.assert_close(policy(changed)["bc_loss"], out["bc_loss"])
    assert float(policy(batch)["bc_loss"]) == 0.0
    assert float(policy({**batch, FROM_DEMONSTRATIONS: torch.zeros_like(demo)})["bc_loss"]) == 0.0


def test_forward_runs_under_bf16_autocast():
    policy = TDMPCPolicy(tiny_config()).train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = policy(training_batch())
    assert torch.isfinite(out["loss"])
    out["loss"].backward()
    assert policy.q_scale.dtype == torch.float32 and torch.isfinite(policy.q_scale)


def reward_error(policy: TDMPCPolicy, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean squared error of the predicted (decoded) rewards along the batch's latent rollout."""
    with torch.no_grad():
        obs = policy.encode_observation({k: batch[k] for k in policy.obs_keys})
        action = policy.normalizer.normalize(ACTION, batch[ACTION])
        z, err = policy.model.encode(obs[:, 0]), []
        for t in range(action.shape[1]):
            err.append((policy.model.reward(z, action[:, t]) - batch[NEXT_REWARD][:, t]) ** 2)
            z = policy.model.next(z, action[:, t])
    return torch.stack(err).mean()


@pytest.mark.parametrize("value_bins", [0, 101])
def test_a_few_updates_fit_a_batch(value_bins):
    torch.manual_seed(0)
    policy = TDMPCPolicy(tiny_config(value_bins=value_bins)).train()
    batch = training_batch()
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=3e-3)
    first_loss, first_error = policy(batch)["reward_loss"], reward_error(policy, batch)
    # From uniform logits, 101 bins take longer to concentrate than a scalar head takes to move.
    for _ in range(30 if value_bins == 0 else 100):
        out = policy(batch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        policy.update_target()
    # A cross-entropy cannot halve towards 0 (its floor is the two-hot targets' entropy, up to log 2).
    assert out["reward_loss"] < (0.5 if value_bins == 0 else 0.6) * first_loss
    assert reward_error(policy, batch) < 0.5 * first_error  # the decoded rewards fit too


def test_gaussian_prior_draws_and_log_density():
    """`pi_sample` is tanh(mean + std * eps) with the log-density of torch's tanh-transformed Normal; `pi` is
    the mean's tanh; the std stays within TD-MPC2's log-std bounds."""
    from torch.distributions import Normal, TanhTransform, TransformedDistribution

    policy = make_policy(prior_entropy_coeff=1e-4)
    model = policy.model
    g = torch.Generator().manual_seed(4)
    z = model.encode(torch.rand(64, policy.obs_dim, generator=g) * 2 - 1)
    eps = torch.randn(64, policy.action_dim, generator=g)
    with torch.no_grad():
        action, log_prob = model.pi_sample(z, eps)
        mean, raw = model.pi_head(z).chunk(2, dim=-1)
        log_std = networks.LOG_STD_MIN + 0.5 * (networks.LOG_STD_MAX - networks.LOG_STD_MIN) * (
            raw.tanh() + 1
        )
        dist = TransformedDistribution(Normal(mean, log_std.exp()), [TanhTransform()])
        torch.testing.assert_close(action, torch.tanh(mean + log_std.exp() * eps))
        inside = action.abs().amax(dim=-1) < 0.99  # where the 1e-6 guard of the log is negligible
        assert inside.sum() > 32
        want = dist.log_prob(action).sum(-1)
        torch.testing.assert_close(log_prob[inside], want[inside], rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(model.pi(z), torch.tanh(mean))
        assert action.shape == (64, policy.action_dim) and (action.abs() < 1).all()


def test_entropy_term_widens_the_gaussian_prior_and_trains_pi_alone():
    """With Q at 0 (fresh heads) the policy objective is the entropy bonus alone: a few steps raise the
    prior's entropy, and only pi_head gets gradients."""
    torch.manual_seed(0)
    coeffs = dict(consistency_coeff=0.0, reward_coeff=0.0, value_coeff=0.0)
    policy = TDMPCPolicy(tiny_config(prior_entropy_coeff=0.1, **coeffs)).train()
    batch = training_batch()
    opt = torch.optim.Adam(policy.model.parameters(), lr=1e-2)
    first = policy(batch)
    first["loss"].backward()
    grads = {n: p.grad is not None and p.grad.abs().sum() > 0 for n, p in policy.model.named_parameters()}
    assert any(v for n, v in grads.items() if n.startswith("pi_head"))
    assert not any(v for n, v in grads.items() if not n.startswith("pi_head"))
    for _ in range(20):
        out = policy(batch)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    assert out["prior_entropy"] > first["prior_entropy"] + 1.0
    assert "prior_entropy" not in TDMPCPolicy(tiny_config())(batch)


def test_two_hot_encodes_onto_neighbouring_bins_and_decodes_back():
    """A value's two-hot weights sit on the two bins around symlog(value) and sum to 1; decoding their
    log-probabilities gives the value back; values beyond the range clip to its ends."""
    two_hot = networks.TwoHot(num_bins=21, symlog_range=10.0)  # bins 1 apart in symlog space
    x = torch.tensor([-300.0, -1.0, 0.0, 0.5, 2.0, 99.0, 5000.0])
    enc = two_hot.encode(x)
    assert enc.shape == (7, 21)
    torch.testing.assert_close(enc.sum(-1), torch.ones(7))
    assert ((enc > 0).sum(-1) <= 2).all()
    nonzero = [torch.nonzero(row).flatten() for row in enc]
    assert all(len(i) == 1 or int(i[1] - i[0]) == 1 for i in nonzero)
    torch.testing.assert_close(two_hot.decode(enc.clamp_min(1e-30).log()), x, rtol=1e-4, atol=1e-4)
    far = two_hot.encode(torch.tensor([1e9, -1e9]))
    assert far[0, -1] == 1.0 and far[1, 0] == 1.0
    # Uniform logits decode to 0 (zero-initialised heads start at 0); the loss is smallest at the target.
    assert abs(float(two_hot.decode(torch.zeros(21)))) < 1e-6
    target = torch.tensor(2.0)
    best = two_hot.loss(two_hot.encode(target).clamp_min(1e-30).log(), target)
    assert best < two_hot.loss(torch.zeros(21), target)
    assert best < two_hot.loss(two_hot.encode(torch.tensor(3.0)).clamp_min(1e-6).log(), target)


def test_value_bins_losses_match_closed_form_at_init():
    """Fresh model with two-hot heads: zero logits decode to 0 (to float rounding of the bins), so TD targets
    are the rewards and each head's cross-entropy against any target is log(num_bins)."""
    torch.manual_seed(0)
    bins = 11
    policy = TDMPCPolicy(tiny_config(discount=0.9, rho=0.5, value_bins=bins))
    batch = training_batch()
    out = policy(batch)
    w = 0.5 ** torch.arange(3.0)
    log_n = torch.log(torch.tensor(float(bins)))
    torch.testing.assert_close(out["td_target_mean"], batch[NEXT_REWARD].mean())
    torch.testing.assert_close(out["reward_loss"], (w * log_n).sum() / 3)
    torch.testing.assert_close(out["value_loss"], (w * 3 * log_n).sum() / 3)  # n_q=3 members summed
    assert abs(float(out["q_mean"])) < 1e-5
    out["loss"].backward()
    assert policy.model.q_ensemble.weights[-1].grad.abs().sum() > 0


def test_update_target_is_an_ema():
    policy = TDMPCPolicy(tiny_config())
    online = policy.model.encoder[0].weight
    target = policy.model_target.encoder[0].weight
    torch.testing.assert_close(online, target)
    with torch.no_grad():
        online.add_(1.0)
    before = target.clone()
    policy.update_target(tau=0.25)
    torch.testing.assert_close(target, before + 0.25)
    policy.update_target(tau=1.0)
    torch.testing.assert_close(target, online)


def test_state_dict_carries_bounds_and_target():
    policy = TDMPCPolicy(tiny_config())
    keys = set(policy.state_dict())
    assert "normalizer.action_center" in keys and "normalizer.observation_state_half_range" in keys
    assert any(k.startswith("model_target.") for k in keys) and "q_scale" in keys


def test_config_validation():
    with pytest.raises(ConfigError, match="image"):
        tiny_config(
            input_features={"observation.image": FeatureConfig(shape=[3, 8, 8], kind="visual")}
        ).validate()
    with pytest.raises(ConfigError, match="low/high"):
        tiny_config(input_features={OBS_STATE: FeatureConfig(shape=[2], kind="state")}).validate()
    with pytest.raises(ConfigError, match="multiple"):
        tiny_config(latent_dim=20).validate()
    with pytest.raises(ConfigError, match="n_q_min"):
        tiny_config(n_q_min=4).validate()
    with pytest.raises(ConfigError, match="bc_coeff"):
        tiny_config(bc_coeff=-1.0).validate()
    with pytest.raises(ConfigError, match="plan_action='best'"):
        tiny_config(plan_action="best").validate()
    with pytest.raises(ConfigError, match="plan_pessimism"):
        tiny_config(plan_pessimism=-0.5).validate()
    with pytest.raises(ConfigError, match="prior_entropy_coeff"):
        tiny_config(prior_entropy_coeff=-1.0).validate()
    with pytest.raises(ConfigError, match="value_bins=1"):
        tiny_config(value_bins=1).validate()
    for bad, match in [
        (dict(activation="relu"), "activation='relu'"),
        (dict(q_dropout=1.0), "q_dropout"),
        (dict(encoder_lr_scale=0.0), "encoder_lr_scale"),
        (dict(q_scale_stat="median"), "q_scale_stat='median'"),
        (dict(policy_q_reduction="max"), "policy_q_reduction='max'"),
    ]:
        with pytest.raises(ConfigError, match=match):
            tiny_config(**bad).validate()


def test_warm_up_schedules_shorten_the_horizon_and_raise_the_std_floor():
    """TD-MPC's schedules: horizon 1 -> full and std floor std_schedule_start -> min_std, linear over
    `schedule_steps` transitions; without a schedule `set_progress` changes nothing."""
    policy = make_policy(horizon=4, schedule_steps=100, std_schedule_start=0.5, min_std=0.05)
    obs = observations(3)
    expected = {0: (1, 0.5), 50: (2, 0.275), 75: (3, 0.1625), 100: (4, 0.05), 500: (4, 0.05)}
    for transitions, (horizon, floor) in expected.items():
        policy.set_progress(transitions)
        assert policy.planner.s.horizon == horizon
        assert policy.planner.std_floor == pytest.approx(floor)
        chunk = policy.predict_action_chunk({k: v.unsqueeze(1) for k, v in obs.items()})
        assert chunk.shape == (3, horizon, 2)
    # The floor bounds the final sampling std, whose multiple of the (seeded) explore noise is added to the
    # first action: at the floor's top (max_std) exploring moves actions far more than at min_std.
    wide = make_policy(horizon=4, schedule_steps=100, std_schedule_start=2.0, max_std=2.0)
    many = observations(64)
    moved = {}
    for transitions in (0, 100):
        wide.set_progress(transitions)
        chunks = []
        for explore in (False, True):
            wide.reset()
            wide.set_noise_seed(3)
            wide.explore = explore
            chunks.append(wide.predict_action_chunk({k: v.unsqueeze(1) for k, v in many.items()})[:, 0])
        wide.explore = False
        moved[transitions] = (chunks[1] - chunks[0]).abs().mean()
    assert moved[0] > 2 * moved[100]
    unscheduled = make_policy(horizon=4)
    unscheduled.set_progress(0)
    assert unscheduled.planner.s.horizon == 4 and unscheduled.planner.std_floor == 0.05
    with pytest.raises(ConfigError, match="n_action_steps=1"):
        tiny_config(schedule_steps=10, n_action_steps=2).validate()
    with pytest.raises(ConfigError, match="std_schedule_start"):
        tiny_config(schedule_steps=10, std_schedule_start=5.0).validate()
