"""Action-queue timing and observation history of the Policy base class."""

import numpy as np
import pytest
import torch

from lerobot.constants import OBS_STATE
from lerobot.policies import Policy


class StepEncodingPolicy(Policy):
    """Chunks encode (call count, newest obs, j): action j of a chunk = 100 * newest obs + j."""

    def __init__(self, n_obs_steps: int, n_action_steps: int, horizon: int):
        super().__init__(n_obs_steps=n_obs_steps, n_action_steps=n_action_steps)
        self.horizon = horizon
        self.calls: list[torch.Tensor] = []

    def predict_action_chunk(self, batch):
        history = batch[OBS_STATE]  # (B, n_obs_steps, 1)
        self.calls.append(history.clone())
        j = torch.arange(self.horizon, dtype=torch.float32).view(1, -1, 1)
        return 100 * history[:, -1:, :] + j

    def forward(self, batch):
        return {"loss": torch.zeros(())}


def obs(*values: float) -> dict:
    return {OBS_STATE: torch.tensor(values, dtype=torch.float32).view(-1, 1)}


@pytest.mark.parametrize("n_obs_steps,n_action_steps", [(1, 1), (2, 3), (3, 4)])
def test_chunk_every_n_action_steps_and_action_timing(n_obs_steps, n_action_steps):
    policy = StepEncodingPolicy(n_obs_steps, n_action_steps, horizon=n_action_steps + 2)
    sent = [policy.select_action(obs(t)).item() for t in range(10)]
    # Chunk made at step t0 (a multiple of n_action_steps) gives action 100 * t0 + (t - t0) at step t.
    expected = [100 * (t - t % n_action_steps) + t % n_action_steps for t in range(10)]
    assert sent == expected
    assert len(policy.calls) == -(-10 // n_action_steps)
    # The history passed at step t0 holds observations t0 - n_obs_steps + 1 .. t0, padded with obs 0 at start.
    for call_ix, history in enumerate(policy.calls):
        t0 = call_ix * n_action_steps
        want = [max(t0 - k, 0) for k in reversed(range(n_obs_steps))]
        assert history.view(-1).tolist() == want


def test_reset_clears_history_and_queue():
    policy = StepEncodingPolicy(2, 4, horizon=4)
    for t in range(3):
        policy.select_action(obs(t))
    policy.reset()
    assert policy.select_action(obs(50)).item() == 5000
    assert policy.calls[-1].view(-1).tolist() == [50, 50]


def test_per_env_reset_only_touches_that_env():
    policy = StepEncodingPolicy(2, 3, horizon=3)
    policy.select_action(obs(0, 10))
    policy.select_action(obs(1, 11))
    policy.reset(env_ids=[1])
    action = policy.select_action(obs(2, 70))
    # env 0 continues its queue; env 1 gets a fresh chunk from a history filled with its new observation.
    assert action.view(-1).tolist() == [2, 7000]
    assert policy.calls[-1].view(-1).tolist() == [70, 70]
    assert policy.calls[-1].shape[0] == 1  # only the reset env was planned for


def test_bad_chunk_shape_is_reported():
    class Short(StepEncodingPolicy):
        def predict_action_chunk(self, batch):
            return torch.zeros(batch[OBS_STATE].shape[0], 1, 1)

    with pytest.raises(ValueError, match="expected"):
        Short(1, 2, horizon=2).select_action(obs(0))


class ReferenceQueue:
    """The queue semantics written the slow, obvious way: per env Python lists."""

    def __init__(self, n_obs_steps: int, n_action_steps: int, n_envs: int):
        self.n_obs, self.n_act = n_obs_steps, n_action_steps
        self.history = [[] for _ in range(n_envs)]
        self.queue = [[] for _ in range(n_envs)]

    def reset(self, env_id: int) -> None:
        self.history[env_id], self.queue[env_id] = [], []

    def step(self, values: list[float]) -> tuple[list[float], list[list[float]]]:
        """Actions for this step, and the histories passed to chunk predictions (envs in order)."""
        actions, planned = [], []
        for env_id, value in enumerate(values):
            history = self.history[env_id] or [value] * self.n_obs
            self.history[env_id] = (history + [value])[-self.n_obs :]
            if not self.queue[env_id]:
                planned.append(list(self.history[env_id]))
                self.queue[env_id] = [100 * value + j for j in range(self.n_act)]
            actions.append(self.queue[env_id].pop(0))
        return actions, planned


@pytest.mark.parametrize("n_obs_steps,n_action_steps", [(1, 1), (1, 4), (2, 3), (3, 2)])
def test_matches_reference_under_random_per_env_resets(n_obs_steps, n_action_steps):
    n_envs = 4
    policy = StepEncodingPolicy(n_obs_steps, n_action_steps, horizon=n_action_steps + 1)
    reference = ReferenceQueue(n_obs_steps, n_action_steps, n_envs)
    rng = torch.Generator().manual_seed(0)
    for t in range(60):
        resets = torch.nonzero(torch.rand(n_envs, generator=rng) < 0.15).flatten().tolist()
        if resets and t > 0:
            policy.reset(env_ids=resets)
            for env_id in resets:
                reference.reset(env_id)
        values = [float(10 * t + e) for e in range(n_envs)]
        n_calls = len(policy.calls)
        batch = obs(*values)
        action = policy.select_action(batch)
        batch[OBS_STATE].fill_(-1.0)  # the caller reuses its buffer: the policy's history must not change
        want_actions, want_planned = reference.step(values)
        assert action.view(-1).tolist() == want_actions, f"step {t}"
        got_planned = [row.view(-1).tolist() for call in policy.calls[n_calls:] for row in call]
        assert got_planned == want_planned, f"step {t}"


def test_returned_actions_are_not_overwritten_by_later_chunks():
    policy = StepEncodingPolicy(1, 2, horizon=2)
    first = policy.select_action(obs(1, 2))
    kept = first.clone()
    policy.reset(env_ids=[0])
    for t in range(5):
        policy.select_action(obs(3 + t, 4 + t))
    assert torch.equal(first, kept)


def test_select_action_without_observation_between_chunks():
    """A policy without history pops queued actions with no observation; a due chunk needs one."""
    policy = StepEncodingPolicy(1, 3, horizon=3)
    with_obs = StepEncodingPolicy(1, 3, horizon=3)
    for t in range(7):
        due = policy.steps_until_chunk() == 0
        got = policy.select_action(obs(t, 10 + t) if due else None)
        assert got.tolist() == with_obs.select_action(obs(t, 10 + t)).tolist()
    assert policy.steps_until_chunk() == 2
    with pytest.raises(ValueError, match="steps_until_chunk"):
        StepEncodingPolicy(1, 3, horizon=3).select_action(None)  # the first call predicts a chunk
    history = StepEncodingPolicy(2, 3, horizon=3)
    history.select_action(obs(0))
    with pytest.raises(ValueError, match="n_obs_steps == 1"):
        history.select_action(None)  # the next chunk reads this step's observation


@pytest.mark.parametrize("ensembled", [False, True])
def test_select_action_numpy_is_select_action_as_a_host_array(ensembled):
    """The rollout's call returns the same actions as `select_action`, as float32 numpy arrays."""
    make = (lambda: EnsembledPolicy(0.3)) if ensembled else (lambda: StepEncodingPolicy(1, 3, horizon=3))
    as_tensor, as_array = make(), make()
    for t in range(7):
        want = as_tensor.select_action(obs(t, 10 + t))
        got = as_array.select_action_numpy(obs(t, 10 + t))
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        assert got.tolist() == want.tolist()


class EnsembledPolicy(Policy):
    """Temporal ensembling of chunks that depend on the observation: action j of a chunk predicted from the
    newest observation x is `(x + j / 3, x * (j + 1) - j)`, so the predictions made for one step differ."""

    def __init__(self, coeff: float, chunk_len: int = 5, n_action_steps: int = 1):
        super().__init__(n_obs_steps=1, n_action_steps=n_action_steps, temporal_ensemble_coeff=coeff)
        self.chunk_len = chunk_len

    def predict_action_chunk(self, batch):
        x = batch[OBS_STATE][:, -1]  # (B, 1)
        j = torch.arange(self.chunk_len, dtype=torch.float32)[None]  # (1, T)
        return torch.stack([x + j / 3, x * (j + 1) - j], dim=-1)  # (B, T, 2)

    def forward(self, batch):
        return {"loss": torch.zeros(())}


@pytest.mark.parametrize("coeff", [0.0, 0.01, 0.7])
def test_ensembling_per_env_resets_match_each_env_alone(coeff):
    """Under random per-env resets, every env slot gets exactly the actions a policy driving that env alone
    gets from the same observations since its reset; a chunk is predicted at every step."""
    n_envs, rng = 4, torch.Generator().manual_seed(0)
    policy = EnsembledPolicy(coeff)
    alone = [EnsembledPolicy(coeff) for _ in range(n_envs)]
    for t in range(40):
        resets = torch.nonzero(torch.rand(n_envs, generator=rng) < 0.2).flatten().tolist()
        if resets and t > 0:
            policy.reset(env_ids=resets)
            for env_id in resets:
                alone[env_id].reset()
        assert policy.steps_until_chunk() == 0
        values = (torch.randn(n_envs, generator=rng) * 50).tolist()
        action = policy.select_action(obs(*values))
        for env_id, single in enumerate(alone):
            assert torch.equal(action[env_id], single.select_action(obs(values[env_id]))[0]), f"step {t}"


def test_ensembling_predicts_every_step_and_needs_observations():
    policy = EnsembledPolicy(0.1)
    policy.select_action(obs(1.0, 2.0))
    assert policy.steps_until_chunk() == 0
    with pytest.raises(ValueError, match="steps_until_chunk"):
        policy.select_action(None)
    # A full reset (or a new batch size) starts every ensemble over: the first action is the chunk's first.
    policy.reset()
    assert policy.select_action(obs(7.0)).tolist() == [[7.0, 7.0]]
    assert policy.select_action(obs(7.0, 8.0)).tolist() == [[7.0, 7.0], [8.0, 8.0]]
    # Chunks of one action: the ensemble is that action.
    single = EnsembledPolicy(0.1, chunk_len=1)
    assert [single.select_action(obs(float(t))).tolist() for t in range(3)] == [
        [[0.0, 0.0]],
        [[1.0, 1.0]],
        [[2.0, 2.0]],
    ]


@pytest.mark.parametrize("coeff,n_action_steps", [(-0.5, 1), (0.1, 2)])
def test_ensembling_settings_are_checked(coeff, n_action_steps):
    with pytest.raises(ValueError, match="temporal_ensemble_coeff"):
        EnsembledPolicy(coeff, n_action_steps=n_action_steps)
