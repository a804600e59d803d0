"""When the env slots of an evaluation that wait for their next episode begin it: one small class per name of
`lerobot.constants.EVAL_SCHEDULES` (docs/evaluation.md). All give identical per-episode results for a
deterministic policy; they differ in how many chunk predictions serve the slots."""

from __future__ import annotations

from typing import Protocol


class RunningEpisodes(Protocol):
    """What a schedule reads of the rollout's episode bookkeeping."""

    @property
    def n_active(self) -> int:
        """The slots whose episode is running."""


class ChunkClock(Protocol):
    """What a schedule reads of the policy."""

    def steps_until_chunk(self) -> int:
        """How many steps only pop queued actions before one predicts a chunk (0: the next)."""


class _Refill:
    """A slot begins the next pending episode as soon as its episode ends."""

    def begin_now(self, episodes: RunningEpisodes, policy: ChunkClock) -> bool:
        """Whether the slots waiting for their next episode begin it now."""
        return True


class _RefillAligned:
    """A slot begins the next pending episode at the next step where the running slots get new chunks (at
    once when none runs), so that one batched chunk prediction serves every slot."""

    def begin_now(self, episodes: RunningEpisodes, policy: ChunkClock) -> bool:
        """Whether the slots waiting for their next episode begin it now."""
        return episodes.n_active == 0 or policy.steps_until_chunk() == 0


class _Batch:
    """Fixed batches: the slots begin their next episodes together, once every slot's episode has ended."""

    def begin_now(self, episodes: RunningEpisodes, policy: ChunkClock) -> bool:
        """Whether the slots waiting for their next episode begin it now."""
        return episodes.n_active == 0


SCHEDULES = {"refill": _Refill(), "refill_aligned": _RefillAligned(), "batch": _Batch()}
