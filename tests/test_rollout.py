"""eval_policy: exact per-episode accounting against a plain single-env loop, sync and async."""

import functools
import os
import signal
import time

import gym_pusht  # noqa: F401  (registers the gym_pusht namespace for the reference env)
import numpy as np
import pytest
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from omegaconf import OmegaConf
from toy_env import make_toy, term_at

from lerobot.config import env_config, validate_config
from lerobot.constants import OBS_STATE
from lerobot.envs import make_env, make_single_env, observation_to_batch
from lerobot.policies import Policy
from lerobot.policies.diffusion.configuration import DiffusionConfig
from lerobot.policies.diffusion.modeling import DiffusionPolicy
from lerobot.rollout import EnvWorkerError, eval_policy


class EchoSeedPolicy(Policy):
    """Deterministic: every action of a chunk repeats the episode's seed (obs[0]) and the step (obs[1])."""

    def __init__(self, n_action_steps: int = 3):
        super().__init__(n_obs_steps=2, n_action_steps=n_action_steps)

    def predict_action_chunk(self, batch):
        newest = batch[OBS_STATE][:, -1]  # (B, 2)
        return newest.unsqueeze(1).repeat(1, self.n_action_steps, 1)

    def forward(self, batch):
        raise NotImplementedError


class EnsembleEchoPolicy(Policy):
    """Temporal ensembling of deterministic chunks that depend on the observations and the step: action j of
    a chunk predicted from observations (o_old, o_new), o = (seed, t), is `(seed, t_new * (1 + j) + t_old / 4 + j)`,
    so the predictions for one step differ and their weighted mean depends on which of them it holds. Element-
    wise maths only: an env's chunk does not depend on the batch."""

    def __init__(self, coeff: float = 0.1, chunk_len: int = 4):
        super().__init__(n_obs_steps=2, n_action_steps=1, temporal_ensemble_coeff=coeff)
        self.chunk_len = chunk_len

    def predict_action_chunk(self, batch):
        history = batch[OBS_STATE]  # (B, 2, 2)
        seed, t_new, t_old = history[:, -1, :1], history[:, -1, 1:], history[:, 0, 1:]  # (B, 1) each
        j = torch.arange(self.chunk_len, dtype=history.dtype)[None]  # (1, T)
        value = t_new * (1 + j) + t_old / 4 + j  # (B, T)
        return torch.stack([seed.expand_as(value), value], dim=-1)

    def forward(self, batch):
        raise NotImplementedError


class NoisyEchoPolicy(EchoSeedPolicy):
    """Stochastic: the echo with Gaussian noise, drawn from each env's episode stream, added to its step, so an
    episode's actions (and, through the env's action weight, its rewards) show which stream it drew from and in
    what order. The seed it echoes stays exact (the env checks it)."""

    def predict_action_chunk(self, batch):
        generators = self.noise_generators()
        assert generators is not None, "evaluation gives every env slot its episode's stream"
        noise = torch.stack([torch.randn(self.n_action_steps, generator=g) for g in generators])
        chunk = super().predict_action_chunk(batch)
        chunk[..., 1] += noise.to(chunk.dtype)
        return chunk


# Policy kind -> (policy factory, env factory). The ensembling env adds action[1] to its rewards, so any
# difference in an ensembled action shows in the per-episode results.
KINDS = {
    "queue": (EchoSeedPolicy, make_toy),
    "ensemble": (EnsembleEchoPolicy, functools.partial(make_toy, action_weight=1e-3)),
    "stream": (NoisyEchoPolicy, functools.partial(make_toy, action_weight=1e-3)),
}


def reference(make_single, policy: Policy, n_episodes: int, start_seed: int) -> list[dict]:
    """One env, one episode at a time, each drawing from its episode's stream: the ground truth eval_policy
    must reproduce."""
    env = make_single()
    out = []
    for i in range(n_episodes):
        o, _ = env.reset(seed=start_seed + i)
        policy.reset(episode_seeds=[start_seed + i])
        rewards, total, success = [], 0.0, False
        while True:
            batch = observation_to_batch({k: v[None] for k, v in o.items()})
            action = policy.select_action(batch)[0].numpy()
            o, r, term, trunc, info = env.step(action)
            rewards.append(r)
            total += float(r)  # accumulated step by step, in the same order as eval_policy
            success |= bool(info["is_success"])
            if term or trunc:
                break
        out.append(
            {
                "sum_reward": total,
                "max_reward": float(np.max(rewards)),
                "success": success,
                "n_steps": len(rewards),
            }
        )
    env.close()
    return out


def strip(per_episode: list[dict]) -> list[dict]:
    return [{k: e[k] for k in ("sum_reward", "max_reward", "success", "n_steps")} for e in per_episode]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("use_async", [False, True])
@pytest.mark.parametrize("num_envs", [1, 3, 4, 5])
@pytest.mark.parametrize("schedule", ["refill", "refill_aligned", "batch"])
def test_toy_env_matches_single_env_reference(num_envs, use_async, schedule, kind):
    make_policy, make_single = KINDS[kind]
    n_episodes, start_seed = 7, 10
    want = reference(make_single, make_policy(), n_episodes, start_seed)
    # Episodes end at different steps, some by termination, some by truncation.
    assert (
        len({e["n_steps"] for e in want}) > 2
        and any(not e["success"] for e in want)
        and any(e["success"] for e in want)
    )
    fns = [make_single] * num_envs
    env = AsyncVectorEnv(fns, context="spawn") if use_async else SyncVectorEnv(fns)
    try:
        got = eval_policy(
            env, make_policy(), n_episodes, start_seed=start_seed, progress=False, schedule=schedule
        )
    finally:
        env.close()
    assert strip(got["per_episode"]) == want
    assert [e["seed"] for e in got["per_episode"]] == list(range(start_seed, start_seed + n_episodes))
    # No stale action from an earlier episode: the echo policy's -1000 penalty never appears.
    assert all(e["max_reward"] > 0 for e in got["per_episode"])


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("schedule", ["refill", "refill_aligned", "batch"])
@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_every_autoreset_mode_counts_exactly(mode, schedule, kind):
    make_policy, make_single = KINDS[kind]
    want = reference(make_single, make_policy(), 5, 0)
    env = SyncVectorEnv([make_single] * 2, autoreset_mode=mode)
    got = eval_policy(env, make_policy(), 5, start_seed=0, progress=False, schedule=schedule)
    assert strip(got["per_episode"]) == want


def test_done_masks_count_up_to_first_done_step():
    """n_steps is the termination step, or the time limit for episodes that never terminate."""
    env = SyncVectorEnv([functools.partial(make_toy, max_episode_steps=12)] * 3)
    got = eval_policy(env, EchoSeedPolicy(), 6, start_seed=0, progress=False)
    for e in got["per_episode"]:
        assert e["n_steps"] == min(term_at(e["seed"]), 12)
        assert e["success"] == (term_at(e["seed"]) <= 12)
        t = np.arange(1, e["n_steps"] + 1)
        assert e["sum_reward"] == pytest.approx(float(np.sum(e["seed"] + t / 100)))


def test_refill_keeps_slots_busier_than_fixed_batches():
    runs = {}
    for schedule in ("batch", "refill"):
        env = SyncVectorEnv([make_toy] * 3)
        runs[schedule] = eval_policy(
            env, EchoSeedPolicy(), 9, start_seed=1, progress=False, schedule=schedule
        )
    assert strip(runs["batch"]["per_episode"]) == strip(runs["refill"]["per_episode"])
    assert runs["refill"]["aggregated"]["slot_utilization"] > runs["batch"]["aggregated"]["slot_utilization"]


class CountingEchoPolicy(EchoSeedPolicy):
    """EchoSeedPolicy that records the batch size of every chunk prediction."""

    def __init__(self, n_action_steps: int):
        super().__init__(n_action_steps)
        self.chunk_batches: list[int] = []

    def predict_action_chunk(self, batch):
        self.chunk_batches.append(batch[OBS_STATE].shape[0])
        return super().predict_action_chunk(batch)


def test_aligned_refill_batches_chunk_predictions():
    """Same episodes as refill, but new episodes join the others' chunk step: fewer, larger predictions."""
    runs, policies = {}, {}
    for schedule in ("refill", "refill_aligned"):
        policies[schedule] = CountingEchoPolicy(n_action_steps=4)
        env = SyncVectorEnv([functools.partial(make_toy, max_episode_steps=30)] * 4)
        runs[schedule] = eval_policy(
            env, policies[schedule], 16, start_seed=1, progress=False, schedule=schedule
        )
    assert strip(runs["refill"]["per_episode"]) == strip(runs["refill_aligned"]["per_episode"])
    refill, aligned = policies["refill"].chunk_batches, policies["refill_aligned"].chunk_batches
    assert len(aligned) < len(refill) and sum(aligned) / len(aligned) > sum(refill) / len(refill)
    # The price: a finished slot idles until the others' next chunk step (< n_action_steps steps).
    utilization = {k: r["aggregated"]["slot_utilization"] for k, r in runs.items()}
    assert 0.5 < utilization["refill_aligned"] < utilization["refill"]


def test_videos_cut_at_episode_end(tmp_path):
    import imageio.v3 as iio

    env = SyncVectorEnv([make_toy] * 2)
    got = eval_policy(
        env, EchoSeedPolicy(), 3, start_seed=1, max_episodes_rendered=2, videos_dir=tmp_path, progress=False
    )
    assert len(got["video_paths"]) == 2
    for path in got["video_paths"]:
        ep = int(path.split("_")[-1].split(".")[0])
        frames = iio.imread(path)
        # One frame for the reset plus one per step.
        assert frames.shape[0] == got["per_episode"][ep]["n_steps"] + 1


def test_n_episodes_must_be_positive():
    env = SyncVectorEnv([make_toy])
    with pytest.raises(ValueError, match="n_episodes"):
        eval_policy(env, EchoSeedPolicy(), 0, progress=False)


def test_async_worker_that_raises_surfaces_in_parent():
    env = AsyncVectorEnv([functools.partial(make_toy, fail_at=2)] * 2, context="spawn")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="toy env failure"):
        eval_policy(env, EchoSeedPolicy(), 2, progress=False)
    assert time.monotonic() - start < 20
    env.close(terminate=True)


def test_async_worker_that_dies_surfaces_in_parent():
    env = AsyncVectorEnv([make_toy] * 2, context="spawn")
    env.reset(seed=0)
    os.kill(env.processes[1].pid, signal.SIGKILL)
    env.processes[1].join(timeout=5)
    start = time.monotonic()
    with pytest.raises(EnvWorkerError, match="died"):
        eval_policy(env, EchoSeedPolicy(), 2, progress=False)
    assert time.monotonic() - start < 20
    env.close(terminate=True)


def test_async_worker_that_hangs_fails_after_the_step_timeout():
    env = AsyncVectorEnv([functools.partial(make_toy, hang_at=2)] * 2, context="spawn")
    start = time.monotonic()
    with pytest.raises(EnvWorkerError, match="did not answer a step within 2 s"):
        eval_policy(env, EchoSeedPolicy(), 2, progress=False, step_timeout_s=2.0)
    assert time.monotonic() - start < 20
    env.close(terminate=True)


def _pusht_env_cfg(name: str, max_steps: int):
    cfg = validate_config({"env": OmegaConf.load(f"configs/env/{name}.yaml")})
    cfg.env.max_episode_steps = max_steps
    return env_config(cfg)


class ChaseKeypointPolicy(Policy):
    """Moves the agent onto the block's first keypoint: element-wise maths only, so bitwise batch-invariant.

    (Reductions such as a mean over keypoints may round differently for different batch sizes, which
    would make actions, and so rewards, differ in the last bit between num_envs settings.)
    """

    def __init__(self):
        super().__init__(n_obs_steps=1, n_action_steps=2)

    def predict_action_chunk(self, batch):
        target = batch["observation.environment_state"][:, -1, :2] * 0.9 + 25.0
        return target.unsqueeze(1).repeat(1, 2, 1)

    def forward(self, batch):
        raise NotImplementedError


@pytest.mark.parametrize("use_async", [False, True])
def test_pusht_policy_matches_reference(use_async):
    env_cfg = _pusht_env_cfg("pusht_keypoints", 40)
    policy = ChaseKeypointPolicy()
    single = functools.partial(make_single_env, env_cfg)  # gym.make plus the observation-key wrapper
    want = reference(single, policy, 5, 100)
    for num_envs in (1, 3, 4):
        env = make_env(env_cfg, num_envs, use_async=use_async)
        try:
            got = eval_policy(env, policy, 5, start_seed=100, progress=False)
        finally:
            env.close()
        # gym-pusht itself is not bitwise reproducible: the same env, seed and actions give rewards that differ
        # in the last bit depending on which episodes ran before in that process. So rewards are compared to
        # 1e-12 here (exactly on the toy env above); steps and success must match exactly.
        got_eps = strip(got["per_episode"])
        assert [(e["n_steps"], e["success"]) for e in got_eps] == [(e["n_steps"], e["success"]) for e in want]
        for g, w in zip(got_eps, want):
            assert g["sum_reward"] == pytest.approx(w["sum_reward"], rel=1e-12, abs=1e-12), (
                f"num_envs={num_envs}"
            )
            assert g["max_reward"] == pytest.approx(w["max_reward"], rel=1e-12, abs=1e-12), (
                f"num_envs={num_envs}"
            )


class RowwiseDiffusion(DiffusionPolicy):
    """Diffusion Policy whose chunks are a function of each env's own observations and noise: every row is
    denoised alone (batch-invariant arithmetic), from its episode's stream when evaluation gives one, else
    from the same seeded noise, so a row depends neither on the other rows nor on earlier calls."""

    def sample_actions(self, global_cond, generator=None):
        rows = []
        for i, row in enumerate(global_cond):
            row_generator = generator[i] if isinstance(generator, list) else torch.Generator().manual_seed(0)
            rows.append(super().sample_actions(row[None], row_generator))
        return torch.cat(rows)


def _tiny_diffusion(env_cfg, policy_class=DiffusionPolicy, **overrides) -> DiffusionPolicy:
    """A tiny untrained keypoint Diffusion Policy (2 observation steps, chunks of 7 actions from now), by
    default executing one action per step with temporal ensembling, DDIM 2; statistics from the features'
    bounds."""
    settings = {
        "n_action_steps": 1,
        "horizon": 8,
        "temporal_ensemble_coeff": 0.05,
        "down_dims": [16, 32],
        "diffusion_step_embed_dim": 8,
        "n_groups": 4,
        "inference_scheduler": "DDIM",
        "num_inference_steps": 2,
        **overrides,
    }
    config = DiffusionConfig(
        input_features=env_cfg.input_features(), output_features=env_cfg.output_features(), **settings
    )
    stats = {
        key: {
            "min": torch.tensor(feature.low).expand(feature.shape),
            "max": torch.tensor(feature.high).expand(feature.shape),
        }
        for key, feature in env_cfg.features.items()
    }
    torch.manual_seed(0)
    return policy_class(config, dataset_stats=stats).eval()


def assert_layouts_match(env_cfg, policy, want, start_seed, env_counts, use_async, schedule) -> None:
    """Evaluating `len(want)` episodes over each of `env_counts` envs gives `want`: steps and success exactly,
    rewards to 1e-12 (gym-pusht's own reproducibility, see above)."""
    for num_envs in env_counts:
        env = make_env(env_cfg, num_envs, use_async=use_async)
        try:
            result = eval_policy(
                env, policy, len(want), start_seed=start_seed, progress=False, schedule=schedule
            )
        finally:
            env.close()
        got = strip(result["per_episode"])
        assert [(e["n_steps"], e["success"]) for e in got] == [(e["n_steps"], e["success"]) for e in want]
        for g, w in zip(got, want):
            for key in ("sum_reward", "max_reward"):
                assert g[key] == pytest.approx(w[key], rel=1e-12, abs=1e-12), f"num_envs={num_envs}"


# Under ensembling every step predicts, so refill_aligned begins episodes at once, as refill does.
@pytest.mark.parametrize(
    "use_async,schedule",
    [(False, "refill"), (False, "refill_aligned"), (False, "batch"), (True, "refill_aligned")],
)
def test_ensembling_diffusion_matches_reference(use_async, schedule):
    """Diffusion Policy with n_action_steps=1 and temporal ensembling: each episode over 1, 3, 4 or 5 envs gets
    what it gets alone (the rewards to 1e-12, as gym-pusht's own, see above)."""
    env_cfg = _pusht_env_cfg("pusht_keypoints", 20)
    policy = _tiny_diffusion(env_cfg, RowwiseDiffusion)
    want = reference(functools.partial(make_single_env, env_cfg), policy, 5, 200)
    assert_layouts_match(env_cfg, policy, want, 200, (1, 3, 4, 5), use_async, schedule)


# DDPM draws noise at every denoising step too; chunk queuing (4 of 7 actions) makes episodes predict at their
# own phases, so slots of one batch are at different draws of their streams.
@pytest.mark.parametrize(
    "use_async,schedule", [(False, "refill"), (False, "refill_aligned"), (False, "batch"), (True, "refill")]
)
def test_stochastic_diffusion_episodes_do_not_depend_on_the_layout(use_async, schedule):
    """Diffusion Policy sampling with DDPM from its episodes' streams, with batch-invariant arithmetic (each
    row denoised alone): each episode over 1, 3 or 5 envs gets exactly what it gets alone."""
    env_cfg = _pusht_env_cfg("pusht_keypoints", 20)
    policy = _tiny_diffusion(
        env_cfg,
        RowwiseDiffusion,
        n_action_steps=4,
        temporal_ensemble_coeff=None,
        inference_scheduler="DDPM",
        num_inference_steps=3,
    )
    want = reference(functools.partial(make_single_env, env_cfg), policy, 5, 300)
    make_single = functools.partial(make_single_env, env_cfg)
    # An episode's stream is keyed by its seed: the same episodes in an evaluation that starts later.
    assert reference(make_single, policy, 4, 301) == want[1:]
    # And the streams matter: the same noise for every chunk gives other episodes.
    policy.generator = torch.Generator()
    assert reference(make_single, policy, 5, 300) != want
    policy.generator = None
    assert_layouts_match(env_cfg, policy, want, 300, (1, 3, 5), use_async, schedule)


def test_diffusion_rows_draw_from_their_own_streams_in_any_batch():
    """Plain (batched) Diffusion Policy: a row's noise comes from its generator alone, so its chunk in a batch
    of 3 is its chunk alone up to float rounding, and another stream gives another chunk."""
    env_cfg = _pusht_env_cfg("pusht_keypoints", 20)
    policy = _tiny_diffusion(env_cfg, temporal_ensemble_coeff=None, inference_scheduler="DDPM")
    torch.manual_seed(1)
    batch = {
        "observation.state": torch.rand(3, 2, 2) * 512,
        "observation.environment_state": torch.rand(3, 2, 16) * 512,
    }

    def streams(*seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]

    together = policy.predict_action_chunk(batch, streams(5, 6, 7))
    alone = policy.predict_action_chunk({k: v[1:2] for k, v in batch.items()}, streams(6))
    torch.testing.assert_close(together[1:2], alone, rtol=1e-4, atol=1e-3)
    other = policy.predict_action_chunk({k: v[1:2] for k, v in batch.items()}, streams(8))
    assert (other - alone).abs().max() > 1.0  # actions in pixels: other noise, another chunk


def test_observation_batch_shapes_and_ranges():
    env_cfg = _pusht_env_cfg("pusht", 300)
    env = make_env(env_cfg, 2)
    o, _ = env.reset(seed=0)
    batch = observation_to_batch(o)
    env.close()
    image = batch["observation.image"]
    assert image.shape == (2, 3, 96, 96) and image.dtype == torch.float32
    assert image.min() >= 0.0 and image.max() <= 1.0 and image.max() > 0.5
    assert batch["observation.state"].shape == (2, 2) and batch["observation.state"].dtype == torch.float32


def test_pixels_without_observation_copies_match_copies():
    """make_env(copy=False) hands out the env's own buffers; eval_policy consumes them before the next step."""
    from lerobot.policies.baselines import ScriptedConfig, ScriptedPushPolicy

    env_cfg = _pusht_env_cfg("pusht", 20)
    cfg = ScriptedConfig(input_features=env_cfg.input_features(), output_features=env_cfg.output_features())
    policy = ScriptedPushPolicy(cfg)
    runs = []
    for copy in (True, False):
        env = make_env(env_cfg, 3, copy=copy)
        runs.append(eval_policy(env, policy, 5, start_seed=7, progress=False)["per_episode"])
        env.close()
    assert runs[0] == runs[1]


def test_wilson_interval_matches_known_values_and_aggregates_carry_intervals():
    from lerobot.episode_stats import aggregate_episodes, wilson_interval

    # Reference values of the Wilson score interval (z = 1.96).
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(64, 100) == pytest.approx((0.5424, 0.7273), abs=1e-4)
    rows = [{"sum_reward": 1.0, "max_reward": r, "success": r > 0.95} for r in (0.2, 0.96, 1.0, 0.5)]
    agg = aggregate_episodes(rows, eval_s=1.0, busy_steps=40, slot_steps=40)
    assert agg["n_episodes"] == 4 and agg["pc_success"] == 50.0
    assert agg["pc_success_ci95_low"] < 50.0 < agg["pc_success_ci95_high"]
    half = 1.96 * np.std([0.2, 0.96, 1.0, 0.5], ddof=1) / 2
    assert agg["avg_max_reward_ci95_high"] - agg["avg_max_reward"] == pytest.approx(half)


def test_episode_figures_come_from_the_steps_kept_since_the_oldest_running_episode_began():
    from lerobot.envs.tasks import episode_plan
    from lerobot.rollout import _Episodes

    episodes = _Episodes(episode_plan(3, start_seed=0), num_envs=2)
    episodes.start(np.arange(2))  # episodes 0 and 1
    rng = np.random.default_rng(0)
    rewards = rng.random((7, 2)).astype(np.float32)  # float32 rewards are summed in float64
    for t in range(3):
        episodes.log_step(rewards[t], np.array([False, t == 1]))
    episodes.finish(np.array([1]))  # episode 1 ends after 3 steps; slot 0 still runs episode 0
    assert len(episodes.rewards) == 3  # episode 0 began at step 0: nothing dropped yet
    episodes.start(np.array([1]))  # episode 2 in slot 1, from step 3
    for t in range(3, 7):
        episodes.log_step(rewards[t], np.array([False, False]))
    episodes.finish(np.array([0]))  # episode 0 ends after 7 steps
    assert (episodes.first_kept, len(episodes.rewards)) == (3, 4)  # only episode 2's steps are left
    episodes.finish(np.array([1]))
    assert (episodes.first_kept, len(episodes.rewards)) == (7, 0) and episodes.done

    def plain_sum(values):
        total = 0.0
        for value in values:
            total += float(value)
        return total

    rows = {row["episode_ix"]: row for row in episodes.per_episode()}
    assert [rows[i]["n_steps"] for i in range(3)] == [7, 3, 4]
    assert [rows[i]["success"] for i in range(3)] == [False, True, False]
    assert rows[0]["sum_reward"] == plain_sum(rewards[:, 0])  # bit for bit: added step by step
    assert rows[1]["sum_reward"] == plain_sum(rewards[:3, 1])
    assert rows[2]["sum_reward"] == plain_sum(rewards[3:, 1])
    assert rows[2]["max_reward"] == float(rewards[3:, 1].max())
