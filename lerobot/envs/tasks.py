"""How a reset seed names an episode of a multi-task env: its task and its own seed, in one integer.

A vector env passes each sub-env nothing but its reset seed (gymnasium shares `options` between them), so
evaluation tells a slot which task to run through that seed. `task_seed(position, episode_seed)` puts the
task's position in the env's task list above the episode's seed; a single-task env (position 0) gets the
episode seed unchanged, so its seeds mean what they always meant. The policy's random stream is keyed by the
same integer, so an episode's initial state and every draw depend on (task, episode) alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Episode seeds stay below this; task positions count in its multiples.
TASK_SEED_STRIDE = 2**32


def task_seed(position: int, episode_seed: int) -> int:
    """The reset seed of episode `episode_seed` (0 <= seed < 2**32) of the task at `position` (>= 0)."""
    if not 0 <= episode_seed < TASK_SEED_STRIDE:
        raise ValueError(f"episode seed {episode_seed} is outside [0, 2**32)")
    if position < 0:
        raise ValueError(f"task position {position} must be >= 0")
    return position * TASK_SEED_STRIDE + episode_seed


def split_task_seed(seed: int) -> tuple[int, int]:
    """(task position, episode seed) of a reset seed made by `task_seed`."""
    if seed < 0:
        raise ValueError(f"reset seed {seed} must be >= 0")
    return divmod(int(seed), TASK_SEED_STRIDE)


@dataclass(frozen=True)
class EpisodeSpec:
    """One evaluation episode: its task (None for a single-task env), the task's position in the env's task
    list, and the episode's own seed."""

    task: str | None
    position: int
    seed: int

    @property
    def reset_seed(self) -> int:
        """The seed the env is reset with (and the policy's episode stream is keyed by)."""
        return task_seed(self.position, self.seed)


def episode_plan(n_per_task: int, start_seed: int, tasks: Sequence[str] | None = None) -> list[EpisodeSpec]:
    """Every episode of an evaluation, task by task: `n_per_task` episodes with seeds `start_seed + k` for each
    task of `tasks` (one task-less run of them for a single-task env)."""
    if n_per_task <= 0:
        raise ValueError(f"n_episodes={n_per_task} must be > 0")
    names: Sequence[str | None] = tasks if tasks else [None]
    return [
        EpisodeSpec(task, position, start_seed + k)
        for position, task in enumerate(names)
        for k in range(n_per_task)
    ]
