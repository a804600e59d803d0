"""What an online run saves in its checkpoints and takes back on resume: its counts (`Counts`), the update's
state, the schedule's carry, the random states and, when kept, the replay buffer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lerobot import random_state
from lerobot.checkpoints.run_layout import latest_checkpoint
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.training.replay_buffer import ReplayBuffer
from lerobot.training.run_dir import RunDir
from lerobot.training.schedule import UpdateSchedule
from lerobot.training.update import TrainStep, restore

log = logging.getLogger(__name__)


@dataclass
class Counts:
    """How far an online run has got; saved in its checkpoints."""

    transitions: int = 0
    updates: int = 0
    # Wall time spent collecting and updating (evaluation and checkpoints excluded), over the whole run.
    train_time_s: float = 0.0
    # Vector steps taken of the collection under way (0 between collections): a stop or a failed env worker
    # may end one halfway, and the resumed run takes the rest before that collection's updates.
    collection_steps: int = 0
    # Updates due after the last collection and not made yet (a stop in the middle of them); the resumed
    # run makes them before it collects again.
    updates_owed: int = 0


def checkpoint_state(
    update: TrainStep, schedule: UpdateSchedule, counts: Counts, buffer: ReplayBuffer | None
) -> dict[str, Any]:
    """What `load_checkpoint_state` needs to continue the run; `buffer` is saved unless None."""
    state = {
        **update.state_dict(),
        "schedule": schedule.state_dict(),
        "transitions": counts.transitions,
        "updates": counts.updates,
        "collection_steps": counts.collection_steps,
        "updates_owed": counts.updates_owed,
        "rng": random_state.get_rng_state(),
        "train_time_s": counts.train_time_s,
    }
    if buffer is not None:
        state["replay_buffer"] = buffer.state_dict()
    return state


def save(run_dir: RunDir, policy: OnlinePolicy, state: dict[str, Any], data: dict[str, Any] | None) -> None:
    """Checkpoint the run at its transition count: the policy's weights, `state` (`checkpoint_state`) and
    the fingerprint of the demonstrations (`data`) when it reads some."""
    run_dir.save(state["transitions"], policy, training_state=state, data_fingerprint=data)


def load_checkpoint_state(
    ckpt_dir: Path, update: TrainStep, schedule: UpdateSchedule, buffer: ReplayBuffer
) -> Counts:
    """Load the checkpoint in `ckpt_dir` (`checkpoint_state`) into the run's objects and the global random
    states; return its counts.

    The replay buffer is restored when the checkpoint holds one, else `buffer` stays empty; one saved with
    another `training.n_envs` or `buffer_capacity` (a branch, `training.init_from`) is copied into this
    run's layout (`ReplayBuffer.load_state_dict`).
    """
    state = restore(ckpt_dir, update)
    schedule.load_state_dict(state["schedule"])
    counts = Counts(
        state["transitions"],
        state["updates"],
        float(state.get("train_time_s", 0.0)),
        # Checkpoints written before a stop could cut a collection or its updates short hold neither.
        int(state.get("collection_steps", 0)),
        int(state.get("updates_owed", 0)),
    )
    random_state.set_rng_state(state["rng"])
    if "replay_buffer" in state:
        saved = state["replay_buffer"]
        buffer.load_state_dict(saved)
        if (saved["rows"], saved["n_envs"]) != (buffer.rows, buffer.n_envs):
            log.info(
                "the replay buffer's %d transitions of %d envs copied into %d rows x %d envs: %d kept (the "
                "newest of each env)",
                int(saved["data"]["valid"].sum()) if saved["data"] else 0,
                saved["n_envs"],
                buffer.rows,
                buffer.n_envs,
                len(buffer),
            )
    owed = f", {counts.updates_owed} updates owed" if counts.updates_owed else ""
    log.info(
        "resumed from %s at %d transitions (%d updates%s)", ckpt_dir, counts.transitions, counts.updates, owed
    )
    return counts


def where_it_stopped(run_dir: Path, counts: Counts) -> str:
    """What an env worker's failure leaves of the run, for its one line: the checkpoint of the last step
    completed, and how to resume from it."""
    last = latest_checkpoint(run_dir)
    if last is None:
        return "no checkpoint was saved: run the command again to start over"
    return (
        f"checkpoint {last.name} holds the run at {counts.transitions} transitions, the last step completed: "
        f"relaunch with output_dir={run_dir} to resume"
    )
