"""Batch keys shared by envs, datasets, policies and trainers.

Observation tensors are `(B, ...)` when they come from an env, `(B, n_obs_steps, ...)` inside a policy;
actions are `(B, action_dim)` towards the env and `(B, horizon, action_dim)` in training batches.
"""

OBS_PREFIX = "observation."
OBS_IMAGE = "observation.image"
OBS_STATE = "observation.state"
OBS_ENV_STATE = "observation.environment_state"
ACTION = "action"
PAD_SUFFIX = "_is_pad"
ACTION_IS_PAD = ACTION + PAD_SUFFIX
NEXT_REWARD = "next.reward"
NEXT_SUCCESS = "next.success"
NEXT_DONE = "next.done"
NEXT_TERMINATED = "next.terminated"  # a real termination: no bootstrapping past it
NEXT_TRUNCATED = "next.truncated"  # a time limit: bootstrapping goes on
EPISODE_INDEX = "episode_index"
FRAME_INDEX = "frame_index"
INDEX = "index"
TIMESTAMP = "timestamp"
# (B,) bool in an online training batch: the sample was drawn from the demonstrations (`sample_mixed`).
FROM_DEMONSTRATIONS = "from_demonstrations"
# Prioritised replay (`ReplayBuffer` with alpha > 0): in the batch, each sample's importance weight (B,) and
# where it was drawn from, (row, env) (B, 2), -1 for demonstrations; in a policy's training output, each
# sample's new priority (B,), which the trainer writes back to the buffer.
SAMPLE_WEIGHT = "sample_weight"
REPLAY_INDEX = "replay_index"
SAMPLE_PRIORITY = "sample_priority"

# A training batch's per-sample random draws, when the trainer made them (`Policy.draw_training_noise`):
# keys starting with this prefix, e.g. Diffusion's "noise.action" (B, horizon, A).
TRAINING_NOISE_PREFIX = "noise."
# What a policy's training output may report besides its `loss`: the count of elements (e.g. real,
# unpadded action values) that its loss is the mean of, a scalar tensor. The trainer weighs the losses of
# N processes by it so that their gradients average to the global batch's.
LOSS_COUNT = "loss_count"

# Feature kinds an env or dataset declares; policies pick their inputs by kind, never by task.
VISUAL = "visual"
STATE = "state"
ENV_STATE = "env_state"
ACTION_KIND = "action"
# An integer input naming the episode's task (a multi-task env's `observation.task_index`): policies that
# serve several tasks embed it; normalization passes it through.
TASK = "task"

# How `eval_policy` starts the next episode in a slot whose episode ended (see lerobot/rollout.py).
EVAL_SCHEDULES = ("refill", "refill_aligned", "batch")

# Environment variable that points at the directory holding `pusht_cchi_v7_replay.zarr` (or the zip).
DATA_ROOT_ENV = "LEROBOT_DATA_ROOT"

# What an evaluation writes in its output directory: aggregated figures, per-episode rows and the config.
EVAL_INFO_FILE = "eval_info.json"
