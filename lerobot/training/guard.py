"""When training diverges: the last checkpoint whose weights are good is kept, and named.

A checkpoint's weights are good once a finite loss has been computed on them. When the loss becomes NaN or
infinite, the weights that gave it are those before the update that computed it (the trainers find it at log
time, `StepMetrics`, which names that update); if they were saved, that checkpoint is not good, and
`checkpoints/last` is moved back to the newest earlier one (the diverged checkpoint stays on disk for
inspection; a resumed run overwrites it). Non-finite weights are never saved (`save_checkpoint` refuses
them), so every checkpoint left is finite.

The guard also keeps the number of checkpoints down (`training.keep_checkpoints`): after each save, the
checkpoints older than the newest N are deleted, except the newest one known to be good. Right after a save
that is the one before it: every loss up to the save was checked finite, so the weights of every earlier
checkpoint gave a finite loss, and the new checkpoint's weights have given none yet. So a run that keeps one
checkpoint holds two between a save and the next, and the one `last` falls back to is never deleted.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import TracebackType

from lerobot.checkpoints.run_layout import checkpoint_dir, list_checkpoints
from lerobot.errors import NonFiniteWeightsError, TrainingDivergedError
from lerobot.training.run_dir.cleanup import prune_checkpoints
from lerobot.training.run_dir.saving import set_last

log = logging.getLogger(__name__)


class DivergenceGuard:
    """Context manager around a trainer's loop that turns a diverged loss or non-finite weights into one
    `TrainingDivergedError` naming the last good checkpoint (and moving `last` back to it when needed).

    The trainer calls `updated()` after each gradient update and `saved(step)` after each checkpoint, which
    deletes the checkpoints the run no longer keeps.
    """

    def __init__(self, run_dir: Path, advice: str, keep: int | None = None):
        """`advice`: what to change before training again (see `TrainStep.advice`); `keep`: how many of
        the newest checkpoints to keep (`training.keep_checkpoints`; None keeps all)."""
        self.run_dir = Path(run_dir)
        self.advice = advice
        self.keep = keep
        self.updates = 0  # gradient updates made in this process
        self._saved: tuple[int, int] | None = None  # (step, updates made before it) of the last checkpoint

    def updated(self) -> None:
        """The weights changed."""
        self.updates += 1

    def saved(self, step: int) -> None:
        """Checkpoint `step` now holds the current weights; delete the checkpoints beyond `keep` (see the
        module's docstring). A failed deletion is a warning: training goes on."""
        self._saved = (step, self.updates)
        if self.keep is None:
            return
        good = [p for p in list_checkpoints(self.run_dir) if int(p.name) < step][-1:]
        try:
            removed = prune_checkpoints(self.run_dir, self.keep, also_keep=good)
        except OSError as e:
            log.warning("could not delete old checkpoints of %s (%s); training goes on", self.run_dir, e)
            return
        if removed:
            log.info("deleted checkpoint %s (training.keep_checkpoints=%d)", ", ".join(removed), self.keep)

    def _diverged_step(self, exc: BaseException) -> int | None:
        """The checkpoint step holding the weights that diverged, if they were saved."""
        if self._saved is None:
            return None
        # A non-finite loss at update n came from the weights after update n - 1; weights that cannot be
        # saved (non-finite) are the current ones.
        known = exc.update if isinstance(exc, TrainingDivergedError) else None
        weights_after = known - 1 if known is not None else self.updates
        step, updates_before = self._saved
        return step if updates_before == weights_after else None

    def __enter__(self) -> DivergenceGuard:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, TrainingDivergedError | NonFiniteWeightsError):
            message = f"{exc}; {self._keep_last_good(self._diverged_step(exc))}; {self.advice}"
            raise TrainingDivergedError(message) from None

    def _keep_last_good(self, diverged_step: int | None) -> str:
        """Point `last` at the newest checkpoint not holding the weights that diverged; say which it is."""
        bad = checkpoint_dir(self.run_dir, diverged_step) if diverged_step is not None else None
        good = [p for p in list_checkpoints(self.run_dir) if p != bad]
        if bad is not None and bad.exists():
            if not good:
                return f"checkpoint {bad} holds the weights that gave it and no earlier checkpoint exists"
            set_last(self.run_dir, good[-1])
            return (
                f"checkpoint {bad.name} holds the weights that gave it, so checkpoints/last now points at the "
                f"last good checkpoint, {good[-1]}"
            )
        if good:
            return f"the last good checkpoint is {good[-1]} (checkpoints/last)"
        return "no checkpoint was saved before"
