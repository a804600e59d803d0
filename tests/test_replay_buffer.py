"""Replay buffer: stored transitions at termination/truncation boundaries, autoreset modes, sub-trajectories."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from lerobot.constants import (
    ACTION,
    FROM_DEMONSTRATIONS,
    NEXT_DONE,
    NEXT_REWARD,
    NEXT_TERMINATED,
    NEXT_TRUNCATED,
    OBS_IMAGE,
    OBS_STATE,
    REPLAY_INDEX,
    SAMPLE_WEIGHT,
)
from lerobot.envs.observation import observation_to_batch
from lerobot.errors import ConfigError
from lerobot.training.demonstrations import sample_mixed
from lerobot.training.replay_buffer import ReplayBuffer, final_observations


class ScriptedEpisodesEnv(gym.Env):
    """Deterministic env whose episodes end at scripted steps, by termination ("T") or truncation ("R").

    Observation: [env_id, episode number, step in episode]; reward after step t: 10 * episode + t + 1.
    `episodes` lists (length, kind) in order; after the list runs out, episodes last 1000 steps.
    """

    observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, env_id: int, episodes: list[tuple[int, str]]):
        self.env_id, self.episodes = env_id, episodes
        self.episode, self.t = -1, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.env_id, self.episode, self.t], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        length, kind = self.episodes[self.episode] if self.episode < len(self.episodes) else (1000, "R")
        end = self.t == length
        reward = 10.0 * self.episode + self.t
        return self._obs(), reward, end and kind == "T", end and kind == "R", {}


def frame(env_id: int, episode: int, t: int) -> np.ndarray:
    """The scripted camera's (8, 8, 3) uint8 frame at a state: random pixels (all of 0..255 occur), one draw
    per state."""
    return np.random.default_rng([env_id, episode, t]).integers(0, 256, (8, 8, 3), dtype=np.uint8)


class ScriptedImagesEnv(ScriptedEpisodesEnv):
    """`ScriptedEpisodesEnv` with a camera, keyed by batch keys: {state: [env_id, episode, step], image:
    `frame` of that state}."""

    observation_space = gym.spaces.Dict(
        {
            OBS_STATE: ScriptedEpisodesEnv.observation_space,
            OBS_IMAGE: gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
        }
    )

    def _obs(self) -> dict[str, np.ndarray]:
        return {OBS_STATE: super()._obs(), OBS_IMAGE: frame(self.env_id, self.episode, self.t)}


def to_batch(obs: np.ndarray) -> dict[str, torch.Tensor]:
    return {OBS_STATE: torch.as_tensor(obs, dtype=torch.float32)}


def collect(
    scripts: list[list[tuple[int, str]]],
    n_steps: int,
    mode: AutoresetMode,
    capacity: int = 10_000,
    env_cls: type[ScriptedEpisodesEnv] = ScriptedEpisodesEnv,
    convert=to_batch,
    **kw,
):
    """Step a vector env of scripted envs (`env_cls`) and record it in a buffer through `convert` (`kw`: the
    buffer's other arguments); return it."""
    fns = [lambda i=i, s=s: env_cls(i, s) for i, s in enumerate(scripts)]
    env = SyncVectorEnv(fns, autoreset_mode=mode)
    buffer = ReplayBuffer(capacity, n_envs=len(scripts), **kw)
    obs, _ = env.reset()
    for step in range(n_steps):
        action = np.full((len(scripts), 1), step / 100, dtype=np.float32)
        result = env.step(action)
        buffer.add_env_step(obs, action, result, mode, convert)
        obs = result[0]
    env.close()
    return buffer


def stored(buffer: ReplayBuffer, env: int) -> list[tuple]:
    """(obs, next_obs, reward, terminated, truncated) of the valid rows of one env, oldest first."""
    d = buffer.data
    rows = [(buffer.pos + i) % buffer.rows for i in range(buffer.rows)] if buffer.full else range(buffer.pos)
    out = []
    for r in rows:
        if not d["valid"][r, env]:
            continue
        o = tuple(int(x) for x in buffer.obs[OBS_STATE][r, env])
        n = tuple(int(x) for x in buffer.next_obs[OBS_STATE][r, env])
        out.append(
            (o, n, float(d["reward"][r, env]), bool(d["terminated"][r, env]), bool(d["truncated"][r, env]))
        )
    return out


def expected(env_id: int, script: list[tuple[int, str]], n_steps: int) -> list[tuple]:
    """The transitions env `env_id` should have produced: next obs of a last step is the final obs."""
    out = []
    for ep, (length, kind) in enumerate([*script, (1000, "R")]):
        for t in range(length):
            end = t + 1 == length
            out.append(
                (
                    (env_id, ep, t),
                    (env_id, ep, t + 1),
                    10.0 * ep + t + 1,
                    end and kind == "T",
                    end and kind == "R",
                )
            )
            if len(out) == n_steps:
                return out
    return out


# Envs end at different steps, some by termination, some by truncation.
SCRIPTS_2 = [[(3, "T"), (2, "R"), (4, "T")], [(4, "R"), (1, "T"), (3, "R")]]
SCRIPTS_3 = [[(2, "T"), (5, "R")], [(3, "R"), (3, "T")], [(6, "T"), (1, "R")]]


@pytest.mark.parametrize("scripts", [SCRIPTS_2, SCRIPTS_3], ids=["2envs", "3envs"])
def test_same_step_autoreset_stores_final_obs(scripts):
    n_steps = 11
    buffer = collect(scripts, n_steps, AutoresetMode.SAME_STEP)
    assert len(buffer) == n_steps * len(scripts)
    for i, script in enumerate(scripts):
        assert stored(buffer, i) == expected(i, script, n_steps)


@pytest.mark.parametrize("scripts", [SCRIPTS_2, SCRIPTS_3], ids=["2envs", "3envs"])
def test_next_step_autoreset_skips_reset_steps(scripts):
    n_steps = 11
    buffer = collect(scripts, n_steps, AutoresetMode.NEXT_STEP)
    for i, script in enumerate(scripts):
        rows = stored(buffer, i)
        assert rows == expected(i, script, len(rows))
        # The vector step right after an episode end is gymnasium's reset step: stored as invalid, only it.
        valid, done = buffer.data["valid"][:n_steps, i], buffer.data["done"][:n_steps, i]
        assert valid[0] and torch.equal(valid[1:], ~done[:-1])


def test_flags_and_bootstrap_mask_in_samples():
    buffer = collect(SCRIPTS_3, 12, AutoresetMode.SAME_STEP)
    batch = buffer.sample(512, horizon=1)
    obs, nxt = batch[OBS_STATE][:, 0], batch[OBS_STATE][:, 1]
    for k in range(512):
        env_id, ep, t = (int(x) for x in obs[k])
        length, kind = ([*SCRIPTS_3[env_id], (1000, "R")])[ep]
        end = t + 1 == length
        assert tuple(int(x) for x in nxt[k]) == (env_id, ep, t + 1)
        assert bool(batch[NEXT_TERMINATED][k, 0]) == (end and kind == "T")
        assert bool(batch[NEXT_TRUNCATED][k, 0]) == (end and kind == "R")
        assert bool(batch[NEXT_DONE][k, 0]) == end
        assert float(batch[NEXT_REWARD][k, 0]) == 10.0 * ep + t + 1


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
def test_sub_trajectories_stay_inside_episodes(mode):
    horizon = 3
    buffer = collect(SCRIPTS_3, 14, mode)
    batch = buffer.sample(1000, horizon=horizon)
    o = batch[OBS_STATE]  # (B, H+1, 3)
    assert o.shape == (1000, horizon + 1, 3)
    assert batch[ACTION].shape == (1000, horizon, 1)
    # Same env and episode all along, steps consecutive: no window crosses an episode end.
    assert torch.all(o[:, :, 0] == o[:, :1, 0]) and torch.all(o[:, :, 1] == o[:, :1, 1])
    assert torch.all(o[:, 1:, 2] - o[:, :-1, 2] == 1)
    # Only the last step of a window may end the episode.
    assert not batch[NEXT_DONE][:, :-1].any()
    # Every valid start is reachable: the sampled set is exactly the set of windows inside episodes.
    starts = {tuple(int(x) for x in row) for row in o[:, 0]}
    want = set()
    for env_id, script in enumerate(SCRIPTS_3):
        for rec in stored(buffer, env_id):
            (_, ep, t) = rec[0]
            length = ([*script, (1000, "R")])[ep][0]
            n_seen = sum(1 for r in stored(buffer, env_id) if r[0][1] == ep)
            if t + horizon <= min(length, n_seen):
                want.add((env_id, ep, t))
    assert starts == want


def test_episodes_shorter_than_horizon_cannot_be_sampled():
    buffer = collect([[(1, "T")] * 20], 20, AutoresetMode.SAME_STEP)
    buffer.sample(8, horizon=1)
    with pytest.raises(RuntimeError, match="shorter than the horizon"):
        buffer.sample(8, horizon=2)


def test_ring_overwrite_never_mixes_old_and_new_rows():
    # One endless episode per env (steps 0, 1, 2, ...) in a 2-env buffer of 5 rows: after 13 steps the rows
    # hold steps 8..12; a window must not wrap from step 12 to step 8.
    buffer = collect([[], []], 13, AutoresetMode.SAME_STEP, capacity=10)
    assert buffer.full and len(buffer) == 10
    o = buffer.sample(500, horizon=2)[OBS_STATE]
    assert set(o[:, 0, 2].int().tolist()) == {8, 9, 10, 11}
    assert torch.all(o[:, 1, 2] == o[:, 0, 2] + 1)


def test_final_observations_dict_and_array():
    info = {
        "final_obs": np.array([None, np.array([7.0, 7.0])], dtype=object),
        "_final_obs": np.array([False, True]),
    }
    out = final_observations(np.zeros((2, 2)), info)
    np.testing.assert_array_equal(out, [[0, 0], [7, 7]])
    info_d = {
        "final_obs": np.array([{"a": np.ones(2)}, None], dtype=object),
        "_final_obs": np.array([True, False]),
    }
    out_d = final_observations({"a": np.zeros((2, 2))}, info_d)
    np.testing.assert_array_equal(out_d["a"], [[1, 1], [0, 0]])


def test_extend_episodes_drops_last_frame_and_truncates():
    # Two demonstration episodes of 3 and 4 frames -> 2 + 3 transitions.
    ep = np.array([0, 0, 0, 1, 1, 1, 1])
    obs = {OBS_STATE: np.arange(7, dtype=np.float32)[:, None]}
    action = np.arange(7, dtype=np.float32)[:, None] * 10
    reward = np.arange(7, dtype=np.float32)
    buffer = ReplayBuffer(7, n_envs=1)
    assert buffer.extend_episodes(obs, action, reward, ep) == 5
    rows = stored(buffer, 0)
    assert [(r[0][0], r[1][0]) for r in rows] == [(0, 1), (1, 2), (3, 4), (4, 5), (5, 6)]
    assert [r[4] for r in rows] == [False, True, False, False, True]
    assert not any(r[3] for r in rows)
    batch = buffer.sample(100, horizon=2)
    assert torch.all(batch[OBS_STATE][:, 1:, 0] - batch[OBS_STATE][:, :-1, 0] == 1)
    assert set(batch[OBS_STATE][:, 0, 0].int().tolist()) == {0, 3, 4}
    torch.testing.assert_close(batch[ACTION][:, :, 0], batch[OBS_STATE][:, :-1, 0] * 10)


def test_state_dict_round_trip_and_mixing():
    buffer = collect(SCRIPTS_2, 9, AutoresetMode.NEXT_STEP)
    copy = ReplayBuffer(10_000, n_envs=2)
    copy.load_state_dict(buffer.state_dict())
    assert len(copy) == len(buffer) and copy.pos == buffer.pos
    for key in ("valid", "episode", "step", "reward"):
        torch.testing.assert_close(copy.data[key], buffer.data[key])
    torch.testing.assert_close(copy.sample(64, 2)[OBS_STATE], buffer.sample(64, 2)[OBS_STATE])
    smaller = ReplayBuffer(100, n_envs=2)  # another layout: the transitions are copied into it
    smaller.load_state_dict(buffer.state_dict())
    assert len(smaller) == len(buffer)

    offline = ReplayBuffer(100, n_envs=1)
    offline.extend_episodes(
        {OBS_STATE: -np.ones((50, 3), np.float32)}, np.zeros((50, 1)), np.zeros(50), np.zeros(50)
    )
    mixed = sample_mixed(buffer, offline, 40, 2, offline_ratio=0.25)
    assert mixed[OBS_STATE].shape == (40, 3, 3)
    assert int((mixed[OBS_STATE][:, 0, 0] == -1).sum()) == 10
    # The demonstration rows are marked, and only they.
    torch.testing.assert_close(mixed[FROM_DEMONSTRATIONS], mixed[OBS_STATE][:, 0, 0] == -1)
    assert not sample_mixed(buffer, None, 8, 2, offline_ratio=0.5)[FROM_DEMONSTRATIONS].any()


def test_prioritized_replay_draws_by_priority_and_weights_undo_the_bias():
    """alpha > 0: a valid start is drawn with probability p**alpha / sum; each sample carries (N P)**-beta
    over the batch's largest, and where it came from, which `update_priorities` writes to."""
    alpha, beta, horizon = 0.6, 0.4, 2
    buffer = collect(SCRIPTS_2, 9, AutoresetMode.SAME_STEP, alpha=alpha, beta=beta)
    n_rows = buffer.filled_rows
    rows = torch.arange(n_rows).unsqueeze(1).expand(n_rows, 2)
    envs = torch.arange(2).expand(n_rows, 2)
    valid = buffer._valid_starts(rows, envs, horizon)
    assert torch.all(buffer.data["priority"][:n_rows] == 1.0)  # new rows: the largest priority so far (1)

    # Priorities 1 .. N over the valid starts, written back as the trainer does.
    index = torch.stack([rows[valid], envs[valid]], dim=1)
    priority = torch.arange(1.0, index.shape[0] + 1)
    buffer.update_priorities(index, priority)
    expected = priority**alpha / (priority**alpha).sum()

    batch = buffer.sample(40_000, horizon)
    drawn = batch[REPLAY_INDEX]
    # Each sample is the sub-trajectory at its index, inside one episode.
    torch.testing.assert_close(batch[OBS_STATE][:, 0], buffer.obs[OBS_STATE][drawn[:, 0], drawn[:, 1]])
    assert torch.all(batch[OBS_STATE][:, 1, 2] == batch[OBS_STATE][:, 0, 2] + 1)
    slot = {tuple(i): k for k, i in enumerate(index.tolist())}
    k = torch.tensor([slot[tuple(i)] for i in drawn.tolist()])  # raises if an invalid start was drawn
    freq = torch.bincount(k, minlength=index.shape[0]) / k.numel()
    torch.testing.assert_close(freq, expected, atol=0.006, rtol=0)
    importance = (index.shape[0] * expected[k]) ** -beta
    torch.testing.assert_close(batch[SAMPLE_WEIGHT], importance / importance.max())

    # A row written after a priority of N gets N; -1 rows are skipped; non-finite priorities are refused.
    assert buffer.max_priority == pytest.approx(index.shape[0] + 1e-6)
    buffer.add(
        {OBS_STATE: torch.zeros(2, 3)},
        torch.zeros(2, 1),
        torch.zeros(2),
        {OBS_STATE: torch.zeros(2, 3)},
        torch.zeros(2),
        torch.zeros(2),
    )
    assert torch.all(buffer.data["priority"][buffer.pos - 1] == buffer.max_priority)
    before = buffer.data["priority"].clone()
    buffer.update_priorities(torch.full((3, 2), -1), torch.ones(3))
    assert torch.equal(buffer.data["priority"], before)
    with pytest.raises(ValueError, match="non-finite"):
        buffer.update_priorities(index[:1], torch.tensor([float("nan")]))


def test_prioritized_state_round_trip_old_buffers_and_mixed_batches():
    buffer = collect(SCRIPTS_2, 9, AutoresetMode.SAME_STEP, alpha=0.6)
    buffer.update_priorities(torch.tensor([[0, 0], [1, 1]]), torch.tensor([5.0, 9.0]))
    copy = ReplayBuffer(10_000, n_envs=2, alpha=0.6)
    copy.load_state_dict(buffer.state_dict())
    assert copy.max_priority == buffer.max_priority
    torch.testing.assert_close(copy.data["priority"], buffer.data["priority"])
    torch.testing.assert_close(copy.sample(64, 2)[REPLAY_INDEX], buffer.sample(64, 2)[REPLAY_INDEX])

    # A buffer saved before priorities existed: every start equally likely, max priority 1.
    old = buffer.state_dict()
    del old["data"]["priority"], old["max_priority"]
    copy.load_state_dict(old)
    assert copy.max_priority == 1.0 and torch.all(copy.data["priority"] == 1.0)

    # Uniform replay adds neither key; with priorities, demonstration rows weigh 1 and point nowhere.
    assert SAMPLE_WEIGHT not in collect(SCRIPTS_2, 9, AutoresetMode.SAME_STEP).sample(8, 2)
    offline = ReplayBuffer(100, n_envs=1)
    offline.extend_episodes(
        {OBS_STATE: -np.ones((50, 3), np.float32)}, np.zeros((50, 1)), np.zeros(50), np.zeros(50)
    )
    mixed = sample_mixed(buffer, offline, 40, 2, offline_ratio=0.25)
    demo = mixed[FROM_DEMONSTRATIONS]
    assert torch.all(mixed[SAMPLE_WEIGHT][demo] == 1) and torch.all(mixed[REPLAY_INDEX][demo] == -1)
    assert torch.all(mixed[REPLAY_INDEX][~demo] >= 0)
    with pytest.raises(ValueError, match="alpha >= 0 and beta in"):
        ReplayBuffer(10, alpha=0.6, beta=2.0)


def collect_images() -> ReplayBuffer:
    """12 SAME_STEP vector steps of 3 scripted camera envs whose episodes end at different steps."""
    return collect(
        SCRIPTS_3, 12, AutoresetMode.SAME_STEP, 60, env_cls=ScriptedImagesEnv, convert=observation_to_batch
    )


def assert_same_samples(a: ReplayBuffer, b: ReplayBuffer) -> None:
    """Both buffers draw the same batch (their generators in one state), equal bit for bit."""
    x, y = a.sample(64, horizon=2), b.sample(64, horizon=2)
    assert x.keys() == y.keys()
    for key in x:
        assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), key


def test_images_are_stored_as_uint8_and_sampled_as_observation_to_batch_scales_them():
    buffer = collect_images()
    for images in (buffer.obs[OBS_IMAGE], buffer.next_obs[OBS_IMAGE]):
        assert images.dtype == torch.uint8 and images.shape == (buffer.rows, 3, 3, 8, 8)
        assert images.untyped_storage().nbytes() == images.numel()  # one byte per pixel
    assert buffer.obs[OBS_STATE].dtype == buffer.next_obs[OBS_STATE].dtype == torch.float32

    batch = buffer.sample(512, horizon=2)
    images, states = batch[OBS_IMAGE], batch[OBS_STATE]  # (B, 3, 3, 8, 8), (B, 3, 3)
    # Episode ends are sampled, and their next observation is the final one (`final_obs`), not the reset one.
    assert batch[NEXT_DONE][:, -1].any() and torch.all(states[:, 1:, 2] == states[:, :-1, 2] + 1)
    raw = np.stack([frame(*state) for state in states.reshape(-1, 3).int().tolist()])
    want = observation_to_batch({OBS_IMAGE: raw})[OBS_IMAGE].reshape(images.shape)
    assert images.dtype == torch.float32 and torch.equal(images, want)


def test_uint8_images_round_trip_through_state_dict():
    buffer = collect_images()
    copy = ReplayBuffer(60, n_envs=3)
    copy.load_state_dict(buffer.state_dict())
    assert copy.obs[OBS_IMAGE].dtype == copy.next_obs[OBS_IMAGE].dtype == torch.uint8
    assert_same_samples(copy, buffer)
    other = ReplayBuffer(40, n_envs=2)  # another layout: copied, still uint8
    other.load_state_dict(buffer.state_dict())
    assert other.obs[OBS_IMAGE].dtype == other.next_obs[OBS_IMAGE].dtype == torch.uint8


def test_buffer_saved_with_float32_images_loads_and_samples_the_same():
    buffer = collect_images()
    old = buffer.state_dict()
    for part in ("obs", "next_obs"):  # the layout before images were kept as uint8: float32 k / 255
        old[part][OBS_IMAGE] = old[part][OBS_IMAGE].float() / 255
    copy = ReplayBuffer(60, n_envs=3)
    copy.load_state_dict(old)
    assert_same_samples(copy, buffer)

    # The first uint8 image added turns the loaded float32 images into uint8, with the same samples.
    obs, next_obs = {k: v[0] for k, v in buffer.obs.items()}, {k: v[0] for k, v in buffer.next_obs.items()}
    for b in (buffer, copy):
        b.add(obs, torch.zeros(3, 1), torch.zeros(3), next_obs, torch.zeros(3), torch.zeros(3))
    assert copy.obs[OBS_IMAGE].dtype == copy.next_obs[OBS_IMAGE].dtype == torch.uint8
    assert_same_samples(copy, buffer)


def test_a_buffer_larger_than_memory_is_one_error_naming_its_size_and_the_setting():
    buffer = ReplayBuffer(capacity=10**13, n_envs=1)
    obs = {"observation.image": torch.zeros(1, 9, 84, 84, dtype=torch.uint8)}
    with pytest.raises(
        ConfigError, match=r"cannot allocate [\d.]+ GB .* 127 kB each .* training.buffer_capacity"
    ):
        buffer.add(obs, torch.zeros(1, 1), torch.zeros(1), obs, torch.zeros(1), torch.zeros(1))


def test_observation_memory_is_committed_as_the_buffer_fills():
    """A buffer of 100,000 pixel transitions (12.7 GB of uint8 frames) holding 10 costs what 10 cost: its
    storage is not written until rows are (measured in a fresh process, whose peak memory is its own)."""
    code = (
        "import resource, torch\n"
        "from lerobot.training.replay_buffer import ReplayBuffer\n"
        "buffer = ReplayBuffer(100_000, 1)\n"
        "obs = {'observation.image': torch.zeros(1, 9, 84, 84, dtype=torch.uint8)}\n"
        "for _ in range(10):\n"
        "    buffer.add(obs, torch.zeros(1, 1), torch.zeros(1), obs, torch.zeros(1), torch.zeros(1))\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(result.stdout.split()[-1]) * 1024 < 3e9  # kB; the whole buffer would be 12.7e9 bytes
