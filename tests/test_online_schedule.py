"""SB3-style schedule of the online trainer: random-action phase and gradient steps per collection."""

from __future__ import annotations

import pytest
import torch

from lerobot.cli import compose_config
from lerobot.config import policy_config
from lerobot.errors import ConfigError
from lerobot.training.schedule import UpdateSchedule
from lerobot.training.update import build_optimizer


def run(schedule: UpdateSchedule, total: int) -> tuple[list[int], list[bool]]:
    """Updates after each collection and whether each vector step acted randomly, up to `total` transitions."""
    updates, random_steps, t = [], [], 0
    while t < total:
        for _ in range(schedule.train_freq):
            random_steps.append(schedule.random_actions(t))
            t += schedule.n_envs
        updates.append(schedule.updates_after_collection(t))
    return updates, random_steps


def test_one_env_one_gradient_step():
    updates, random_steps = run(UpdateSchedule(n_envs=1, gradient_steps=1, learning_starts=3), 10)
    # Transitions after each collection: 1..10; updates once the count exceeds learning_starts=3.
    assert updates == [0, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    # Random actions while fewer than 3 transitions were collected before the step.
    assert random_steps == [True, True, True] + [False] * 7


def test_one_env_minus_one_equals_one():
    a, _ = run(UpdateSchedule(n_envs=1, gradient_steps=-1, learning_starts=3), 10)
    b, _ = run(UpdateSchedule(n_envs=1, gradient_steps=1, learning_starts=3), 10)
    assert a == b


def test_four_envs_gradient_steps():
    # 4 transitions per vector step; learning_starts=10 -> totals 4, 8, 12, 16, 20.
    ones, random_steps = run(UpdateSchedule(n_envs=4, gradient_steps=1, learning_starts=10), 20)
    assert ones == [0, 0, 1, 1, 1]
    assert random_steps == [True, True, True, False, False]  # transitions before: 0, 4, 8 < 10
    as_collected, _ = run(UpdateSchedule(n_envs=4, gradient_steps=-1, learning_starts=10), 20)
    assert as_collected == [0, 0, 4, 4, 4]
    # train_freq=2: 8 transitions per collection, -1 gives 8 updates, 3 gives 3.
    freq2, random_steps = run(
        UpdateSchedule(n_envs=4, train_freq=2, gradient_steps=-1, learning_starts=10), 32
    )
    assert freq2 == [0, 8, 8, 8]
    assert random_steps == [True, True, True, False, False, False, False, False]
    fixed, _ = run(UpdateSchedule(n_envs=4, train_freq=2, gradient_steps=3, learning_starts=0), 32)
    assert fixed == [3, 3, 3, 3]


def test_utd_ratio_takes_precedence_and_carries_fractions():
    half, _ = run(UpdateSchedule(n_envs=1, gradient_steps=5, utd_ratio=0.5), 8)
    assert half == [0, 1, 0, 1, 0, 1, 0, 1]
    double, _ = run(UpdateSchedule(n_envs=4, gradient_steps=1, utd_ratio=2.0), 12)
    assert double == [8, 8, 8]
    third, _ = run(UpdateSchedule(n_envs=1, utd_ratio=1 / 3), 9)
    assert sum(third) == 3


def test_count_updates_matches_and_does_not_consume_state():
    schedule = UpdateSchedule(n_envs=4, train_freq=1, gradient_steps=-1, learning_starts=100, utd_ratio=0.3)
    predicted = schedule.count_updates(1000)
    updates, _ = run(schedule, 1000)
    assert predicted == sum(updates) == int(0.3 * (1000 - 100) + 1e-9)
    restored = UpdateSchedule(n_envs=1, utd_ratio=0.5)
    restored.updates_after_collection(1)
    state = restored.state_dict()
    again = UpdateSchedule(n_envs=1, utd_ratio=0.5)
    again.load_state_dict(state)
    assert again.updates_after_collection(2) == restored.updates_after_collection(2) == 1


class _OneWeight(torch.nn.Module):
    """The least a policy needs for `build_optimizer`: parameters in groups."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def optimizer_param_groups(self) -> list[dict]:
        return [{"params": [self.weight]}]


def test_tdmpc_cpu_recipe_drops_the_learning_rate_at_its_90000th_transition():
    """The recipe's step rule counts updates; its docs and results name transitions. The two must agree."""
    cfg = compose_config(["+experiment=tdmpc_pusht_keypoints_cpu"])
    policy_cfg = policy_config(cfg)
    schedule = UpdateSchedule.from_config(cfg.training)
    updates_at_90k = schedule.count_updates(90_000)
    total_updates = schedule.count_updates(cfg.training.steps)
    _, scheduler = build_optimizer(_OneWeight(), policy_cfg, total_updates)
    factor = scheduler.lr_lambdas[0]  # the rate after n updates is optimizer_lr * factor(n)
    assert factor(updates_at_90k - 1) == 1.0
    assert factor(updates_at_90k) == pytest.approx(0.1)
    assert factor(total_updates) == pytest.approx(0.1)


def test_invalid_settings():
    with pytest.raises(ConfigError):
        UpdateSchedule(n_envs=1, gradient_steps=-2)
    with pytest.raises(ConfigError):
        UpdateSchedule(n_envs=0)
    with pytest.raises(ConfigError):
        UpdateSchedule(n_envs=1, utd_ratio=-1.0)


def test_training_loop_says_when_log_checkpoint_and_eval_are_due(tmp_path):
    from lerobot.cli import compose_config
    from lerobot.training.progress import TrainingLoop

    cfg = compose_config(
        ["policy=tdmpc", "env=pendulum", "training.steps=45", "training.log_freq=10", "training.save_freq=20"]
    )
    cfg.eval.freq = 0
    due = []
    with TrainingLoop(cfg, tmp_path, start=0, resumed=False, unit="tr", progress=False) as loop:
        while loop.running:
            d = loop.advance(4)
            due.append((loop.step, d.log, d.checkpoint, d.eval))
    # A period is due when the count crosses one of its multiples (8 -> 12 crosses 10), and all at the end.
    logged = [s for s, log, _, _ in due if log]
    saved = [s for s, _, ckpt, _ in due if ckpt]
    assert logged == [12, 20, 32, 40, 48] and saved == [20, 40, 48]
    assert not any(e for *_, e in due)


def test_stop_line_names_every_process_the_signal_reached_by_the_time_the_checkpoint_is_written(
    tmp_path, monkeypatch
):
    # torchrun forwards its SIGTERM to its workers one after the other: rank 0 may get it just after the
    # step's exchange saw rank 1's. The loop asks again on leaving, so the stop line names both.
    import signal

    from lerobot.cli import compose_config
    from lerobot.runtime.signals import stop_on_signals
    from lerobot.training import progress as training_run

    cfg = compose_config(["policy=tdmpc", "env=pendulum", "training.steps=40", "training.save_freq=20"])
    cfg.eval.freq = 0
    exchanges = iter([{}, {1: signal.SIGTERM}, {0: signal.SIGTERM, 1: signal.SIGTERM}])
    monkeypatch.setattr(training_run.distributed, "stop_signals", lambda signum: next(exchanges))
    monkeypatch.setattr(training_run.distributed, "world_size", lambda: 2)
    with (
        stop_on_signals() as stop,
        training_run.TrainingLoop(cfg, tmp_path, start=0, resumed=False, unit="tr", progress=False) as loop,
    ):
        loop.advance(4)
        stop.signum = signal.SIGTERM  # what the handler records
        due = loop.advance(4)
        assert due.checkpoint and not loop.running
        assert stop.received_by == (1,)  # what the step's exchange saw
    assert (stop.stopped_at, stop.stop_signum) == (8, signal.SIGTERM)
    assert stop.received_by_text(2) == " (received by all 2 processes)"


@pytest.mark.parametrize("utd_ratio", [None, 0.5])
def test_initial_updates_come_once_when_learning_starts(utd_ratio):
    """TD-MPC's catch-up: `initial_updates` extra updates after the first collection past learning_starts,
    once, also for a schedule rebuilt mid-run (a resume): the test reads the count, not a flag."""
    kwargs = dict(n_envs=4, gradient_steps=1, learning_starts=10, utd_ratio=utd_ratio)
    plain, _ = run(UpdateSchedule(**kwargs), 24)
    with_initial, _ = run(UpdateSchedule(**kwargs, initial_updates=7), 24)
    # Totals 4, 8, 12, 16, 20, 24: the collection that reaches 12 is the first past learning_starts.
    assert [b - a for a, b in zip(plain, with_initial)] == [0, 0, 7, 0, 0, 0]
    assert UpdateSchedule(**kwargs, initial_updates=7).count_updates(24) == sum(plain) + 7
    resumed = UpdateSchedule(**kwargs, initial_updates=7)
    assert resumed.updates_after_collection(16) == plain[3]
    with pytest.raises(ConfigError, match="initial_updates"):
        UpdateSchedule(n_envs=1, initial_updates=-1)
