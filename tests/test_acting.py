"""`ActingState` on its own, driven by a fake chunk predictor: queue timing, resets, refills, temporal
ensembling, the non-finite refusal and episode streams."""

import numpy as np
import pytest
import torch

from lerobot.constants import OBS_STATE
from lerobot.errors import NonFiniteActionError
from lerobot.policies.acting import ActingState, TemporalEnsemble, episode_stream, refuse_non_finite


class FakePredictor:
    """Action j of a chunk predicted from newest observation x is `100 * x + j` (one action dim), or what
    `next_chunk` says. Records every call: the histories it got, the env slots of its rows, and one draw per
    row from `noise_generators()` when there are generators."""

    def __init__(self, acting: ActingState, horizon: int):
        self.acting, self.horizon = acting, horizon
        self.histories: list[list[list[float]]] = []  # per call, per row: the history values
        self.env_ids: list[list[int] | None] = []
        self.draws: list[list[float] | None] = []
        self.resets: list[list[int] | None] = []
        self.next_chunk: torch.Tensor | None = None

    def predict_action_chunk(self, batch):
        history = batch[OBS_STATE]  # (b, n_obs_steps, 1)
        self.histories.append(history[..., 0].tolist())
        ids = self.acting.chunk_env_ids
        self.env_ids.append(None if ids is None else ids.tolist())
        generators = self.acting.noise_generators()
        self.draws.append(
            None if generators is None else [torch.rand(1, generator=g).item() for g in generators]
        )
        if self.next_chunk is not None:
            chunk, self.next_chunk = self.next_chunk, None
            return chunk
        j = torch.arange(self.horizon, dtype=torch.float32).view(1, -1, 1)
        return 100 * history[:, -1:, :] + j

    def on_reset(self, env_ids):
        self.resets.append(None if env_ids is None else env_ids.tolist())


def make(n_obs_steps: int, n_action_steps: int, horizon: int | None = None, coeff: float | None = None):
    acting = ActingState(n_obs_steps, n_action_steps, coeff)
    return acting, FakePredictor(acting, horizon or n_action_steps)


def obs(*values: float) -> dict:
    return {OBS_STATE: torch.tensor(values, dtype=torch.float32).view(-1, 1)}


def test_queue_timing_table_of_the_policy_docstring():
    """n_obs_steps=2, n_action_steps=3: chunks at steps 0 and 3, from (o0, o0) and (o2, o3); chunk[j] runs at
    step t + j."""
    acting, fake = make(2, 3, horizon=5)
    actions, until = [], []
    for t in range(7):
        until.append(acting.steps_until_chunk())
        actions.append(acting.act(fake, obs(float(t))).tolist())
    assert fake.histories == [[[0.0, 0.0]], [[2.0, 3.0]], [[5.0, 6.0]]]
    assert actions == [[[0.0]], [[1.0]], [[2.0]], [[300.0]], [[301.0]], [[302.0]], [[600.0]]]
    assert until == [0, 2, 1, 0, 2, 1, 0]
    assert fake.env_ids == [None, None, None]  # every env's chunk at once: rows are all slots
    assert fake.resets == [None]  # the first observation sets the batch size: every env starts over


def test_partial_reset_refills_only_that_slot_and_unaligns_the_queue():
    acting, fake = make(2, 3)
    acting.act(fake, obs(0, 10, 20))
    acting.act(fake, obs(1, 11, 21))
    assert acting.aligned_step == 0 and acting.steps_until_chunk() == 1
    acting.reset(fake, [1])
    assert fake.resets[-1] == [1] and acting.steps_until_chunk() == 0
    assert acting.act(fake, obs(2, 70, 22)).ravel().tolist() == [2, 7000, 2002]
    # Only slot 1 was predicted for, from a history of its new observation alone.
    assert fake.env_ids[-1] == [1] and fake.histories[-1] == [[70.0, 70.0]]
    # Slots 0 and 2 refill at step 3, slot 1 at step 5: no common queue column any more.
    assert acting.aligned_step is None and acting.refill_step == 3
    assert acting.act(fake, obs(3, 71, 23)).ravel().tolist() == [300, 7001, 2300]
    assert fake.env_ids[-1] == [0, 2] and fake.histories[-1] == [[2.0, 3.0], [22.0, 23.0]]
    assert acting.refill_step == 5 and acting.aligned_step is None
    acting.act(fake, obs(4, 72, 24))
    assert acting.act(fake, obs(5, 73, 25)).ravel().tolist() == [302, 7300, 2302]
    assert fake.env_ids[-1] == [1] and acting.refill_step == 6


def test_aligned_queue_is_read_as_a_view_and_later_chunks_leave_returned_actions_alone():
    acting, fake = make(1, 2)
    first = acting.act(fake, obs(1, 2))
    assert np.shares_memory(first, acting.queue)  # aligned: one queue column, no gather
    kept = first.copy()
    acting.reset(fake, [0])  # slot 0 refills next step: the queue is copied, not written in place
    for t in range(4):
        acting.act(fake, obs(3 + t, 4 + t))
    assert np.array_equal(first, kept)


def test_resets_of_no_slot_or_before_the_first_step_clear_nothing():
    acting, fake = make(1, 2)
    acting.reset(fake, [0, 1])  # no env has acted: nothing to clear, no hook
    assert fake.resets == []
    acting.act(fake, obs(1, 2))
    acting.reset(fake, [])
    assert fake.resets == [None] and acting.steps_until_chunk() == 1
    acting.reset(fake)
    assert fake.resets == [None, None] and acting.batch_size == 0 and acting.queue is None


def test_a_new_batch_size_or_key_set_starts_every_env_over():
    acting, fake = make(2, 3)
    acting.act(fake, obs(1, 2))
    acting.act(fake, obs(3))  # one env now
    assert fake.histories[-1] == [[3.0, 3.0]] and fake.resets == [None, None]
    acting.act(fake, {**obs(4), "observation.environment_state": torch.zeros(1, 2)})
    assert fake.histories[-1] == [[4.0, 4.0]] and fake.resets == [None, None, None]


def test_observation_and_none_batch_rules():
    acting, fake = make(1, 3)
    with pytest.raises(ValueError, match=r"select_action\(None\) needs n_obs_steps == 1"):
        acting.act(fake, None)  # the first call predicts a chunk
    acting.act(fake, obs(5))
    assert acting.act(fake, None).tolist() == [[501.0]]  # between chunks, no observation needed
    with pytest.raises(KeyError, match="needs observation keys"):
        acting.act(fake, {"action": torch.zeros(1, 1)})
    history, fake2 = make(2, 3)
    history.act(fake2, obs(0))
    with pytest.raises(ValueError, match="steps_until_chunk"):
        history.act(fake2, None)  # the next chunk reads this step's observation


def test_chunk_shape_is_checked():
    acting, fake = make(1, 3, horizon=2)
    with pytest.raises(ValueError, match=r"FakePredictor.predict_action_chunk returned shape \(2, 2, 1\); "):
        acting.act(fake, obs(0, 1))


@pytest.mark.parametrize("ahead", [0, 2])
def test_non_finite_chunk_is_refused_naming_slot_and_steps_ahead(ahead):
    acting, fake = make(1, 3)
    acting.act(fake, obs(0, 1, 2))
    acting.reset(fake, [1, 2])
    chunk = torch.zeros(2, 3, 1)
    chunk[1, ahead, 0] = float("nan")  # row 1 of the refill is env slot 2
    fake.next_chunk = chunk
    with pytest.raises(NonFiniteActionError, match=r"non-finite action \[nan\] for env slot 2") as error:
        acting.act(fake, obs(3, 4, 5))
    assert (error.value.slot, error.value.steps_ahead) == (2, ahead)
    # Nothing was queued or counted: the next call predicts for slots 1 and 2 again.
    assert acting.step == 1 and acting.steps_until_chunk() == 0
    acting.act(fake, obs(3, 4, 5))
    assert fake.env_ids[-1] == [1, 2]


def test_refuse_non_finite_passes_finite_actions_and_finds_the_first_bad_one():
    refuse_non_finite(np.full((2, 3, 2), 3e38, np.float32), np.array([4, 7]))  # sums past float32 max: finite
    actions = np.zeros((2, 3, 2), np.float32)
    actions[1, 2, 0], actions[1, 1, 1] = np.nan, -np.inf
    with pytest.raises(NonFiniteActionError, match=r"\[0.0, -inf\] for env slot 7") as error:
        refuse_non_finite(actions, np.array([4, 7]))
    assert (error.value.slot, error.value.steps_ahead, error.value.action) == (7, 1, [0.0, float("-inf")])


def test_ensemble_weights_are_float32_exp_and_running_sum():
    weights, cumulative = TemporalEnsemble(0.25).weights(4)
    want = np.exp(-0.25 * np.arange(4, dtype=np.float32))
    assert weights.dtype == np.float32 and cumulative.dtype == np.float32
    assert np.allclose(weights, want, rtol=1e-7) and np.allclose(cumulative, np.cumsum(want), rtol=1e-6)
    assert TemporalEnsemble(0.0).weights(3)[1].tolist() == [1.0, 2.0, 3.0]


def reference_means(chunks: list[np.ndarray], coeff: float) -> list[float]:
    """The actions an ensemble of one env executes: the weighted mean over the chunks predicted for each step,
    the i-th oldest weighted exp(-coeff * i), computed directly in float64."""
    executed = []
    for now in range(len(chunks)):
        preds = [chunks[t][now - t] for t in range(now + 1) if now - t < len(chunks[t])]
        w = np.exp(-coeff * np.arange(len(preds)))
        executed.append(float(np.dot(w, preds) / w.sum()))
    return executed


def recurrence_means(chunks: list[np.ndarray], coeff: float) -> list[np.float32]:
    """The same with the online update of the `TemporalEnsemble` docstring, scalar by scalar in float32 torch:
    the bits the ensemble must give."""
    weights = torch.exp(-coeff * torch.arange(len(chunks[0])))
    cumulative = torch.cumsum(weights, dim=0)
    means: dict[int, tuple[torch.Tensor, int]] = {}  # step -> (mean, n)
    executed = []
    for now, chunk in enumerate(chunks):
        for j, a in enumerate(torch.from_numpy(chunk)):
            mean, n = means.get(now + j, (None, 0))
            new = a if n == 0 else (mean * cumulative[n - 1] + a * weights[n]) / cumulative[n]
            means[now + j] = (new, n + 1)
        executed.append(np.float32(means.pop(now)[0].item()))
    return executed


@pytest.mark.parametrize("coeff", [0.0, 0.01, 0.7])
def test_ensemble_means_are_the_weighted_means_to_the_bit_of_the_online_update(coeff):
    rng = np.random.default_rng(0)
    chunks = [rng.normal(size=4).astype(np.float32) * 10 for _ in range(9)]
    ensemble = TemporalEnsemble(coeff)
    got = [ensemble.add(chunk[None, :, None])[0, 0] for chunk in chunks]
    assert [g.tobytes() for g in got] == [r.tobytes() for r in recurrence_means(chunks, coeff)]
    assert np.allclose(got, reference_means(chunks, coeff), rtol=1e-5)
    assert ensemble.counts.tolist() == [[3, 2, 1]]  # a full window: T-1 .. 1 predictions for the next steps


def test_ensemble_forget_restarts_only_those_slots():
    ensemble = TemporalEnsemble(0.1)
    for x in (1.0, 2.0):
        ensemble.add(np.full((2, 3, 1), x, np.float32))
    ensemble.forget(np.array([1]))
    action = ensemble.add(np.full((2, 3, 1), 9.0, np.float32))
    assert action[1, 0] == 9.0 and action[0, 0] != 9.0  # slot 1 has only its new chunk; slot 0 merges three
    assert ensemble.counts.tolist() == [[2, 1], [1, 1]]


def test_ensembled_acting_predicts_every_step_and_refuses_only_this_steps_action():
    acting, fake = make(1, 1, horizon=3, coeff=0.0)
    assert acting.act(fake, obs(1, 2)).ravel().tolist() == [100.0, 200.0]
    assert acting.steps_until_chunk() == 0 and fake.env_ids == [None]
    # A NaN two steps ahead is not executed now: it is not refused yet.
    fake.next_chunk = torch.tensor([[[0.0], [0.0], [float("nan")]], [[0.0], [0.0], [0.0]]])
    assert acting.act(fake, obs(1, 2)).ravel().tolist() == [50.5, 100.5]  # mean of (101, 0) and (201, 0)
    fake.next_chunk = torch.zeros(2, 2, 1)
    with pytest.raises(
        ValueError, match="after chunks of 3 actions: temporal ensembling needs one chunk length"
    ):
        acting.act(fake, obs(1, 2))
    acting.act(fake, obs(1, 2))  # (a refused call counts no step)
    with pytest.raises(NonFiniteActionError, match="for env slot 0") as error:
        acting.act(fake, obs(1, 2))  # the NaN predicted two steps ago for this step
    assert error.value.steps_ahead == 0


def test_streams_are_keyed_by_episode_seed_not_by_slot():
    """Slot order, batch neighbours and other slots' resets change nobody's draws."""
    acting, fake = make(1, 1)
    acting.reset(fake, episode_seeds=[11, 22, 33])
    acting.act(fake, obs(0, 0, 0))
    acting.act(fake, obs(0, 0, 0))
    acting.reset(fake, [1], episode_seeds=[44])  # slot 1 begins episode 44
    acting.act(fake, obs(0, 0, 0))
    swapped, fake2 = make(1, 1)
    swapped.reset(fake2, [2, 0, 1], episode_seeds=[11, 44, 33])
    swapped.act(fake2, obs(0, 0, 0))
    a, b = fake.draws, fake2.draws
    assert (b[0][2], b[0][0], b[0][1]) == (a[0][0], a[2][1], a[0][2])
    stream = episode_stream(11)
    assert [a[0][0], a[1][0], a[2][0]] == [torch.rand(1, generator=stream).item() for _ in range(3)]
    assert len({a[0][0], a[0][1], a[0][2], a[2][1]}) == 4  # four episodes, four streams
    with pytest.raises(ValueError, match="reset got 1 episode seeds for 2 env slots"):
        acting.reset(fake, [0, 1], episode_seeds=[5])


def test_without_streams_noise_generators_is_none():
    acting, fake = make(1, 1)
    acting.reset(fake, [0], episode_seeds=[3])  # only slot 0 of two has a stream
    acting.act(fake, obs(0, 0))
    assert fake.draws == [None] and acting.noise_generators() is None  # outside a prediction: None too
    acting.reset(fake)  # a full reset without seeds forgets every stream
    acting.act(fake, obs(0))
    assert fake.draws[-1] is None


def test_episode_stream_depends_on_the_seed_only():
    assert torch.equal(torch.rand(5, generator=episode_stream(7)), torch.rand(5, generator=episode_stream(7)))
    assert not torch.equal(
        torch.rand(5, generator=episode_stream(7)), torch.rand(5, generator=episode_stream(8))
    )
    # Not the stream that the bare integer seeds.
    assert not torch.equal(
        torch.rand(5, generator=episode_stream(7)), torch.rand(5, generator=torch.Generator().manual_seed(7))
    )


def test_settings_are_checked():
    with pytest.raises(ValueError, match="must be >= 1"):
        ActingState(0, 1)
    with pytest.raises(
        ValueError, match=r"temporal_ensemble_coeff=0.1 must be >= 0 and needs n_action_steps=1"
    ):
        ActingState(1, 2, 0.1)


def test_ensembled_partial_reset_starts_that_slots_means_over():
    acting, fake = make(1, 1, horizon=3, coeff=0.5)
    acting.act(fake, obs(1, 2))
    acting.reset(fake, [1])
    assert fake.resets[-1] == [1] and acting.steps_until_chunk() == 0
    action = acting.act(fake, obs(5, 7)).ravel()
    assert action[1] == 700.0  # slot 1: its new chunk alone
    assert action[0] != 500.0  # slot 0: the mean of 101 and 500
