"""Action-queue timing and observation history of the Policy base class."""

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
