"""A training batch that is one shard of a larger global batch (data-parallel training on N processes).

Data-parallel training is exact when every process draws the random numbers of the whole global batch from
the same seeded stream and keeps its own rows: the diffusion noise, the timesteps and the crop offsets of a
sample are then the ones a single process would have given it, and every process's random stream stays
where the single process's is. A policy draws its per-sample randomness through `current_shard().rows`
and sums figures that span the global batch (e.g. the count of real, unpadded actions that a masked loss
divides by) with `current_shard().total`; outside a sharded update (one process, evaluation) the shard is
the whole batch and both are plain calls.

The trainer sets the shard around each update with `sharded_batch(...)`; the policy never sees a process
group.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from torch import Tensor


def _identity(x: Tensor) -> Tensor:
    return x


@dataclass(frozen=True)
class BatchShard:
    """Shard `index` of `count` equal, contiguous shards of the global batch.

    Attributes:
        index: which shard this process holds (its rows are `[index * b, (index + 1) * b)` of the global
            batch, `b` the local batch size).
        count: number of shards (processes).
        total: sums a tensor over all shards (an all-reduce); identity for a single shard. Not
            differentiable: for figures of the data, such as counts.
    """

    index: int = 0
    count: int = 1
    total: Callable[[Tensor], Tensor] = field(default=_identity)

    def rows(self, draw: Callable[[int], Tensor], local_size: int) -> Tensor:
        """This shard's rows of a random draw for the global batch.

        Args:
            draw: `n -> Tensor (n, ...)`, random values for n samples (one row each), e.g.
                `lambda n: torch.randn(n, T, A)`.
            local_size: rows of this shard (the local batch size, or e.g. images per local batch).

        Returns:
            `(local_size, ...)`: rows `[index * local_size, (index + 1) * local_size)` of `draw(local_size *
            count)`; the random stream advances as it does for the global batch on one process.
        """
        if self.count == 1:
            return draw(local_size)
        start = self.index * local_size
        return draw(local_size * self.count)[start : start + local_size]


# The one-process case: the shard is the whole batch.
WHOLE_BATCH = BatchShard()
_CURRENT: ContextVar[BatchShard | None] = ContextVar("batch_shard", default=None)


def current_shard() -> BatchShard:
    """The shard of the global batch that the running update holds (the whole batch outside one)."""
    return _CURRENT.get() or WHOLE_BATCH


@contextlib.contextmanager
def sharded_batch(shard: BatchShard) -> Iterator[None]:
    """Make `shard` the `current_shard()` for the duration (e.g. one forward pass of a training update)."""
    token = _CURRENT.set(shard)
    try:
        yield
    finally:
        _CURRENT.reset(token)
