"""Structured configuration: the schema every Hydra config is validated against at start-up.

The dataclasses below (and each policy's configuration dataclass) are the one source of every default:
`configs/` holds only the choices (`env/*.yaml`; `policy/*.yaml` optionally, for named variants) and values
that differ from a default. A composed config is merged into `RootConfig`, so an unknown key or a wrong
type fails before any work starts, with a message that names the key; the merged result holds every field,
resolved, including the `policy` section (validated by the chosen policy's own dataclass, see `lerobot.policy_registry`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lerobot.constants import ACTION_KIND, ENV_STATE, EVAL_SCHEDULES, STATE, TASK, VISUAL
from lerobot.errors import ConfigError

FEATURE_KINDS = (VISUAL, STATE, ENV_STATE, TASK, ACTION_KIND)
# `env.observation_keys` path that stands for the whole observation of an env whose observation is one
# array rather than a dict (e.g. Pendulum's).
WHOLE_OBSERVATION = "."
# Where the YAML configs live (Hydra's primary config directory).
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
# Values `device` accepts (resolved by `lerobot.distributed.resolve_device`).
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?|mps")
# Values `recipe` accepts (the rule: `lerobot.cli.recipes`), and the environment variable holding its default.
RECIPES = ("auto", "cpu", "paper")
RECIPE_ENV = "LEROBOT_RECIPE"
# `dataset.repo_id`: `<owner>/<name>`, each part of letters, digits, `_`, `-` and `.` that starts and ends
# with a letter, digit or `_` (the hub's rule); with no `..` or `--` in it (`check_repo_id`).
REPO_ID_PATTERN = re.compile(r"(?!.*(\.\.|--))[\w](?:[\w.-]*\w)?/[\w](?:[\w.-]*\w)?", re.ASCII)
# `env.name`: one file name (it names the default run and evaluation directories, `<time>_<env>_<policy>`).
ENV_NAME_PATTERN = re.compile(r"\w[\w.-]*", re.ASCII)


@dataclass
class FeatureConfig:
    """One named tensor an env emits or a policy outputs: its shape without batch/time dims and its kind."""

    shape: list[int] = field(default_factory=list)
    kind: str = STATE
    # Optional bounds, one per element or one for all (e.g. the action space); policies without dataset
    # statistics (online RL) normalize with them.
    low: list[float] | None = None
    high: list[float] | None = None
    # A `task` feature's vocabulary: id i is task `names[i]` (MetaWorld: the 50 task names, sorted). A dataset
    # without the feature gets it from each episode's task string (`lerobot.datasets.factory.task_ids`).
    names: list[str] | None = None
    # Task name -> the sentence a dataset may name it by instead (LeRobot's MetaWorld task descriptions).
    descriptions: dict[str, str] | None = None


@dataclass
class EnvConfig:
    """A gymnasium task and the features it produces (names, shapes), read by policies and datasets.

    `features` declares every batch key: observation features (`kind` visual, state or env_state; images
    are declared channels-first, `[3, H, W]`) and the action (`kind: action`). `observation_keys` says
    where each observation feature comes from in the env's own observation: `path: batch key`, where a
    path names a key of the observation dict, `/` goes into nested dicts (gym-aloha's
    `pixels/top: observation.images.top`), and `.` is the whole observation of an env that returns one
    array (Pendulum's `.: observation.state`). Observation entries that no path names are dropped.
    """

    name: str = "pusht"
    gym_id: str = "gym_pusht/PushT-v0"
    fps: int = 10
    max_episode_steps: int = 300
    # Keyword arguments of `gymnasium.make` (e.g. gym-pusht's `obs_type`).
    gym_kwargs: dict[str, Any] = field(default_factory=dict)
    features: dict[str, FeatureConfig] = field(default_factory=dict)
    # env observation path -> batch key (one of `features`); see the class docstring.
    observation_keys: dict[str, str] = field(default_factory=dict)
    # Multi-task env families (MetaWorld): one task (`pick-place-v3`), a named set (`mt10`) or a list; the
    # env gets it as its `task` keyword, and evaluation runs `eval.n_episodes` episodes of each task. null
    # for a single-task env.
    task: Any = None
    # [low, high]: the bounds of the env's per-step reward (PushT: [0, 1]), so of an episode's max reward;
    # evaluation clips the 95% interval of avg_max_reward to them (a normal interval leaves them at a few
    # episodes). null: not known, not clipped.
    reward_range: list[float] | None = None

    def input_features(self) -> dict[str, FeatureConfig]:
        """Observation features (everything that is not an action)."""
        return {k: v for k, v in self.features.items() if v.kind != ACTION_KIND}

    def output_features(self) -> dict[str, FeatureConfig]:
        """Action features."""
        return {k: v for k, v in self.features.items() if v.kind == ACTION_KIND}


@dataclass
class DatasetConfig:
    """Where the offline demonstrations live and how they are split."""

    # Importer of the source data (`lerobot.datasets.factory.IMPORTERS`): `pusht_zarr` reads Diffusion
    # Policy's `pusht_cchi_v7_replay.zarr`, `lerobot` a LeRobotDataset (v3.0/v2.1); either is converted once
    # into the project's memory-mapped format. null: `lerobot` if `repo_id` is set, else `pusht_zarr`.
    format: str | None = None
    # pusht_zarr: directory holding `pusht_cchi_v7_replay.zarr` or `pusht.zip` (falls back to
    # $LEROBOT_DATA_ROOT, then to a download into `cache_dir`). lerobot: the LeRobotDataset directory itself
    # (holds meta/info.json); null: `$HF_LEROBOT_HOME/<repo_id>`, then the huggingface_hub cache / a download.
    root: str | None = None
    # LeRobotDataset on the Hugging Face hub, e.g. `lerobot/pusht` (docs/lerobot_dataset.md): `<owner>/<name>`
    # (`check_repo_id`), which also names its directories under `$HF_LEROBOT_HOME` and `cache_dir`.
    repo_id: str | None = None
    # Hub revision of `repo_id`; null: `v3.0`, the tag LeRobot 0.4-0.6 loads.
    revision: str | None = None
    # Where downloads and conversions go; None: `~/.cache/lerobot`.
    cache_dir: str | None = None
    # Fraction of whole episodes held out for validation, drawn with `split_seed`.
    val_fraction: float = 0.0
    split_seed: int = 0
    # [height, width]: a LeRobotDataset's camera frames are resized to this at import (each pixel the mean of
    # the source pixels it covers), e.g. LeRobot's 480x480 MetaWorld frames for a 96x96 env; null keeps them.
    image_size: list[int] | None = None


@dataclass
class TrainingConfig:
    """Optimisation loop settings shared by the offline (dataset) and online (replay buffer) trainers."""

    # Offline: gradient steps. Online: env transitions summed over all envs (Stable-Baselines3 semantics).
    steps: int = 100_000
    # null: the policy's own default (e.g. 64 for image Diffusion Policy, 256 for low-dimensional).
    batch_size: int | None = None
    # DataLoader worker processes (offline training).
    num_workers: int = 2
    log_freq: int = 100
    save_freq: int = 10_000
    # How many of the newest checkpoints a run keeps; older ones are deleted after each save, except the
    # newest one known to be good (the divergence guard's fallback) and the one `checkpoints/last` points at
    # (docs/checkpoints.md). 3: the paper-size image model writes 4.9 GB per checkpoint, so a default run
    # keeps about 15 GB instead of 50, and still has the newest checkpoint, the fallback when its weights
    # diverge, and one more for a checkpoint found damaged. null keeps every checkpoint.
    keep_checkpoints: int | None = 3
    # auto | true | false. auto: continue the run in `output_dir` from its last checkpoint (weights,
    # optimizer, data order, RNG) when it holds one, else start fresh; true: it must hold one; false: it
    # must not (docs/training_runs.md). A resumed run must have the same config, bar RESUMABLE_CHANGES.
    resume: str = "auto"
    # A run directory (its last checkpoint) or one checkpoint directory that a new run starts from: its
    # weights, optimizer moments, counters and replay buffer, under this launch's config, which may change
    # how training goes on (steps, UTD, learning rate, losses) but not the model's shape. Only when
    # `output_dir` holds no checkpoint yet; a relaunch resumes the branch itself (docs/training_runs.md).
    init_from: str | None = None
    # auto | true | false: bf16 autocast for the forward/backward pass, the one mixed-precision switch. It pays
    # on CUDA and on a CPU with native bf16 kernels (AMX, AVX-512); a CPU with AVX2 alone emulates bf16, many
    # times slower than float32 (docs/benchmarks.md). auto: bf16 where the device has native bf16, else float32
    # (`lerobot.distributed.resolve_amp`); true on such a CPU warns at start-up.
    use_amp: str = "false"
    # torch.compile the training forward pass (the loss; backward follows it). The first updates compile (up
    # to minutes); it pays where launching many small operators sets the pace, as on a GPU with the
    # paper-size model (docs/gpu.md). Same math: a checkpoint resumes with it on or off.
    compile: bool = False
    grad_clip_norm: float = 10.0
    # On N processes: seconds a training step's collective waits for the other processes before every process
    # ends with one line naming the missing ones (a stopped or hung process). A step takes milliseconds to a
    # few seconds and the processes wait for one another only for their difference, so 60 s is far past any
    # normal wait yet ends a stuck run within about a minute. The first step (a compile), the step after a
    # checkpoint or an evaluation, and start-up wait 30 minutes instead (docs/distributed.md).
    collective_timeout_s: float = 60.0
    # Online (TD-MPC) only: vectorized envs collecting experience, SB3-style schedule (docs/tdmpc.md).
    n_envs: int = 1
    use_async_envs: bool = False
    # Collect this many steps of every env between two rounds of updates.
    train_freq: int = 1
    gradient_steps: int = 1  # -1: as many updates as transitions just collected
    utd_ratio: float | None = None  # updates per transition; takes precedence over gradient_steps
    # Transitions collected with random actions before the first update.
    learning_starts: int = 1000
    # Updates made at once, on the random data alone, when learning starts (TD-MPC: as many as learning_starts).
    initial_updates: int = 0
    buffer_capacity: int = 1_000_000
    # Prioritised replay (TD-MPC: alpha 0.6, beta 0.4): a start is drawn with probability proportional to its
    # priority (the policy's TD error) to the power per_alpha, and weighted by (N * P)^-per_beta in the loss.
    # 0: uniform replay (as TD-MPC2 does).
    per_alpha: float = 0.0
    per_beta: float = 0.4
    # Share of each batch drawn from the offline dataset (0: online experience only).
    offline_ratio: float = 0.0
    # Store the replay buffer with each checkpoint, so that a resumed run continues it exactly.
    save_buffer: bool = False
    # Resume even though the training data differs from the data the checkpoint was trained on (its
    # fingerprint: format, episodes, frames, content hash); the run goes on with the checkpoint's
    # normalization statistics. false: such a resume stops with one line naming both (docs/training_runs.md).
    allow_other_data: bool = False


@dataclass
class EvalConfig:
    """Batched evaluation: how many episodes, over how many envs at once."""

    n_episodes: int = 50
    # Number of envs stepped at once; auto: what fits the machine's memory, at most 50 (one line at start-up
    # says how many; `lerobot.envs.factory.plan_vector_env`).
    batch_size: int | str = "auto"
    # auto | true | false: "auto" is sync below 3 cores, else it times sync and async stepping of this env
    # once per machine and picks the faster (see `lerobot.envs.resolve_use_async`).
    use_async_envs: str = "auto"
    # Episodes saved as mp4 videos.
    max_episodes_rendered: int = 4
    # Episode i is reset with seed start_seed + i, whatever the number of envs (gymnasium seeds are >= 0).
    start_seed: int = 100_000
    # Evaluate every `freq` training steps (0 disables periodic evaluation).
    freq: int = 10_000
    # Async envs: seconds after which a step (or reset, or render) that has not returned fails (a hung
    # worker), enforced by a watchdog thread at no cost per step; the online trainer's collection steps too
    # (`training.use_async_envs`), which then save a checkpoint of the last step completed. 120: 40 times the
    # slowest real step seen (a Meta-World step with a 480x480 software render on a busy 2-core CPU, 3 s).
    # null waits forever; a dead worker fails at once either way.
    step_timeout_s: float | None = 120.0
    # When a slot whose episode ended starts the next one: refill_aligned (at the other slots' next chunk
    # step, so chunk predictions stay batched), refill (at once) or batch (fixed batches). Same episodes.
    schedule: str = "refill_aligned"
    # A directory to write the evaluated episodes into, as a LeRobotDataset v3.0 (observations, actions,
    # rewards, success and done flags, episode seeds; cameras as videos): `dataset.repo_id=<owner>/<name>
    # dataset.root=<it>` trains on it. It must not exist yet; null records nothing (docs/evaluation.md).
    record_dataset: str | None = None
    # Evaluate a checkpoint on tasks (env.task) its run was not trained on. false: refused, in one line naming
    # them; true: evaluated, and labelled in eval_info.json (`tasks_not_trained_on`) and on the console.
    allow_untrained_tasks: bool = False


# What `inference.dtype` accepts (the torch dtypes of the same names).
INFERENCE_DTYPES = ("float32", "bfloat16")


@dataclass
class InferenceConfig:
    """How evaluation generates actions: an opt-in speed layer (`lerobot.accel`) for the policies registered
    with one (Diffusion Policy); at the defaults, as the policy trains.

    None of these settings changes the weights or the checkpoint; they take effect inside
    `lerobot.accel.accelerated(policy, cfg.inference)`, which evaluation enters.

    Attributes:
        fast: generate chunks with an `InferencePlan` (`lerobot.accel.diffusion`: weights cast and prepacked
            once, time-major matmuls, FiLM of the observations hoisted out of the denoising loop) instead of
            the training modules.
        dtype: "float32" or "bfloat16", what the networks compute in (the sampler stays fp32). With
            `fast=false`, bf16 means autocast over the training modules.
        int8_weights: (bf16 fast path on CPU) also keep the U-Net weights in int8, one scale per output
            channel, and read them in the matmuls with at most `INT8_MAX_ROWS` (4) rows (batch 1's deepest
            levels), which are bound by weight bytes. Changes actions slightly more than bf16 alone.
        compile: `torch.compile` the fast path's U-Net step (inductor fuses the small operators between
            the matmuls, which keep their prepared kernels). The first chunk compiles, and once more at the
            second batch size seen: a graph with a dynamic batch, which then serves every batch size.
    """

    fast: bool = False
    dtype: str = "float32"
    int8_weights: bool = False
    compile: bool = False

    def validate(self) -> None:
        """Raise `ConfigError` on a combination the layer cannot run."""
        if self.dtype not in INFERENCE_DTYPES:
            raise ConfigError(f"inference.dtype={self.dtype!r}: expected one of {INFERENCE_DTYPES}")
        if self.compile and not self.fast:
            raise ConfigError("inference.compile=true compiles the fast path: set inference.fast=true")
        if self.int8_weights and not self.fast:
            raise ConfigError("inference.int8_weights=true is a fast-path option: set inference.fast=true")
        if self.int8_weights and self.dtype != "bfloat16":
            raise ConfigError("inference.int8_weights=true needs inference.dtype=bfloat16")


@dataclass
class WandbConfig:
    """Weights & Biases logging; off by default, `mode: offline` works with no network."""

    enable: bool = False
    project: str = "lerobot"
    # offline works with no network; `wandb sync` uploads later.
    mode: str = "offline"
    entity: str | None = None


OFFLINE = "offline"  # learns from a dataset of demonstrations
ONLINE = "online"  # learns from its own experience (replay buffer)
NO_TRAINING = "none"  # baselines


# diffusers' step-wise constant schedule, the one that takes `scheduler_step_rules`.
PIECEWISE_SCHEDULE = "piecewise_constant"


def _step_rules_are_valid(rules: str) -> bool:
    """Whether `rules` reads "m1:u1,...,m": positive factors, increasing positive updates."""
    *pieces, last = rules.split(",")
    try:
        pairs = [piece.split(":") for piece in pieces]
        factors = [float(f) for f, _ in pairs] + [float(last)]
        updates = [int(u) for _, u in pairs]
    except ValueError:  # a number that does not parse, or a piece that is not one factor:update pair
        return False
    return min(factors) > 0 and all(u > 0 for u in updates) and updates == sorted(set(updates))


@dataclass
class PolicyConfig:
    """Shared policy settings: history/queue lengths, features, optimiser and EMA defaults."""

    name: str = ""
    n_obs_steps: int = 1
    n_action_steps: int = 1
    input_features: dict[str, FeatureConfig] = field(default_factory=dict)
    output_features: dict[str, FeatureConfig] = field(default_factory=dict)
    # Temporal ensembling (ACT): predict a chunk at every step and execute the mean of all the predictions
    # made for that step, the i-th oldest weighted by exp(-coeff * i); needs n_action_steps=1. None: off
    # (chunks are queued and executed). See `lerobot.policies.policy.Policy`.
    temporal_ensemble_coeff: float | None = None

    # Training defaults; `training.batch_size` overrides `batch_size` when set.
    training_mode: str = NO_TRAINING
    batch_size: int | None = 64
    optimizer_lr: float = 1e-4
    optimizer_betas: tuple[float, float] = (0.9, 0.999)
    optimizer_eps: float = 1e-8
    optimizer_weight_decay: float = 0.0
    scheduler_name: str = "constant"  # any name diffusers.optimization.get_scheduler accepts
    scheduler_warmup_steps: int = 0
    # With scheduler_name=piecewise_constant: "m1:u1,m2:u2,...,m" scales the rate by m1 before update u1,
    # by m2 from u1 to u2, ..., and by m from the last u on. Updates, not env transitions, for an online policy.
    scheduler_step_rules: str | None = None
    use_ema: bool = False
    ema_power: float = 0.75
    ema_max_decay: float = 0.9999

    def resolve_defaults(self) -> None:
        """Fill the fields whose default depends on the features (left `None` in the dataclass); none by
        default. Called once, by `lerobot.policy_registry.make_policy_config`, before `validate`."""

    def validate(self) -> None:
        """Raise `ConfigError` on inconsistent values, changing nothing; subclasses extend it (call super)."""
        if self.n_obs_steps < 1 or self.n_action_steps < 1:
            raise ConfigError(
                f"policy.n_obs_steps={self.n_obs_steps} and policy.n_action_steps={self.n_action_steps} must be >= 1"
            )
        if not self.output_features:
            raise ConfigError(f"policy {self.name!r} has no output (action) feature")
        if self.temporal_ensemble_coeff is not None:
            if not self.temporal_ensemble_coeff >= 0:
                raise ConfigError(
                    f"policy.temporal_ensemble_coeff={self.temporal_ensemble_coeff} must be >= 0 (or null: off)"
                )
            if self.n_action_steps != 1:
                raise ConfigError(
                    f"policy.temporal_ensemble_coeff={self.temporal_ensemble_coeff} needs policy.n_action_steps=1 "
                    f"(got {self.n_action_steps}): ensembling predicts a chunk at every step"
                )
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"policy.batch_size={self.batch_size} must be >= 1")
        if not self.optimizer_lr > 0:
            raise ConfigError(f"policy.optimizer_lr={self.optimizer_lr} must be a positive number")
        if self.scheduler_step_rules is not None and not _step_rules_are_valid(self.scheduler_step_rules):
            raise ConfigError(
                f"policy.scheduler_step_rules={self.scheduler_step_rules!r}: expected 'factor:update,...,factor' "
                "with positive factors and increasing positive updates, e.g. '1:42500,0.1' (the full rate for "
                "42,500 updates, then a tenth)"
            )
        if (self.scheduler_name == PIECEWISE_SCHEDULE) != (self.scheduler_step_rules is not None):
            raise ConfigError(
                f"policy.scheduler_step_rules={self.scheduler_step_rules!r} and "
                f"policy.scheduler_name={self.scheduler_name!r}: step rules go with "
                f"scheduler_name={PIECEWISE_SCHEDULE} and it needs them; set both or neither"
            )
        if self.scheduler_step_rules is not None and self.scheduler_warmup_steps:
            raise ConfigError(
                f"policy.scheduler_warmup_steps={self.scheduler_warmup_steps}: the {PIECEWISE_SCHEDULE} "
                "schedule has no warm-up; set it to 0, or start the step rules with a small factor"
            )

    # ------------------------------------------------------------------ features by kind
    @property
    def image_features(self) -> dict[str, list[int]]:
        """`{key: (C, H, W)}` of the visual inputs (cameras), in the order of the input features."""
        return {k: list(f.shape) for k, f in self.input_features.items() if f.kind == VISUAL}

    @property
    def state_feature(self) -> tuple[str, int] | None:
        """`(key, dim)` of the `state` input (the robot's own position), or None."""
        return self._single_vector(STATE)

    @property
    def env_state_feature(self) -> tuple[str, int] | None:
        """`(key, dim)` of the `env_state` input (e.g. keypoints), or None."""
        return self._single_vector(ENV_STATE)

    @property
    def task_feature(self) -> tuple[str, int] | None:
        """`(key, number of task ids)` of the `task` input (a multi-task env's task index, a scalar per
        step with ids 0 .. high), or None. The count comes from the feature's declared `high`."""
        found = [(k, f) for k, f in self.input_features.items() if f.kind == TASK]
        if not found:
            return None
        if len(found) > 1 or list(found[0][1].shape) != [] or not found[0][1].high:
            raise ConfigError(
                f"{self.name} policy takes one scalar 'task' input (shape []) with its highest id as `high`, got "
                f"{[(k, f.shape, f.high) for k, f in found]}"
            )
        key, feature = found[0]
        return key, int(max(feature.high)) + 1

    @property
    def action_key(self) -> str:
        """Batch key of the (single) action feature."""
        (key,) = self.output_features
        return key

    def _single_vector(self, kind: str) -> tuple[str, int] | None:
        found = [(k, f) for k, f in self.input_features.items() if f.kind == kind]
        if not found:
            return None
        if len(found) > 1:
            raise ConfigError(
                f"{self.name} policy takes at most one {kind!r} input, got {[k for k, _ in found]}"
            )
        key, feature = found[0]
        if len(feature.shape) != 1:
            raise ConfigError(f"input feature {key!r} ({kind}) must be a vector, got shape {feature.shape}")
        return key, feature.shape[0]

    @property
    def action_dim(self) -> int:
        """Size of the (single) action feature."""
        (feature,) = self.output_features.values()
        return feature.shape[0]

    def delta_timestamps(self, fps: int) -> dict[str, list[float]] | None:
        """Offsets (seconds) of the dataset frames one training sample needs, per feature; None if none."""
        return None

    @classmethod
    def upgrade_saved(cls, section: DictConfig) -> DictConfig:
        """Rewrite, in place, the keys of a `policy` section saved by an older version (a checkpoint's
        `config.yaml`) into today's; none by default. Returns `section`."""
        return section


@dataclass
class RootConfig:
    """The whole run: env, policy, dataset, training, evaluation, logging."""

    env: EnvConfig = field(default_factory=EnvConfig)
    # The chosen policy's config: a `PolicyConfig` node typed by the policy's registered dataclass (`name`
    # picks it, e.g. `DiffusionConfig`), every field resolved and validated, the env's features attached,
    # once `lerobot.policy_registry.validate_run_config` has run (read it with `policy_config`). Declared
    # `Any` because Hydra composes it before the name is known (a variant YAML in a config dir is a plain
    # section with `name:` and overrides).
    policy: Any = None
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # How evaluation generates actions (`inference.fast=true inference.dtype=bfloat16`, see `InferenceConfig`).
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    seed: int = 1000
    # auto | cpu | cuda | cuda:N | mps. auto: CUDA when present, else MPS (Apple GPU), else the CPU (docs/gpu.md).
    device: str = "auto"
    # auto | cpu | paper: which model a training run composes. auto: where `device` resolves to the CPU, the CPU
    # recipe of the chosen policy and env (configs/experiment/*_cpu.yaml) when one exists, else the policy's
    # defaults (the paper's model); cpu: the CPU recipe on any device; paper: the policy's defaults. An explicit
    # +experiment=NAME turns the rule off; overrides apply on top (`lerobot.cli.recipes`). Default: $LEROBOT_RECIPE,
    # else auto.
    recipe: str = f"${{oc.env:{RECIPE_ENV},auto}}"
    # The configs/experiment recipe this run was composed with, set at composition (+experiment=NAME or the one
    # `recipe` picked); null: none, the policy's defaults.
    recipe_applied: str | None = None
    # Run directory; None: outputs/train/<date>/<time>_<env>_<policy>. Pass an existing one to resume.
    output_dir: str | None = None
    job_name: str | None = None


def validate_config(cfg: DictConfig | dict) -> DictConfig:
    """Merge a composed config into the `RootConfig` schema and check values; raise `ConfigError` if bad.

    Every default of the root sections is filled in. The `policy` section is left out (`policy` is None): it is
    checked, completed and typed by its registered dataclass in `lerobot.policy_registry.validate_run_config`,
    which calls this first.
    """
    section = policy_section(cfg)
    # `policy.inference.fast=true` is the old place of the inference settings (a checkpoint's is moved at load).
    if section is not None and "inference" in section:
        old = section["inference"]
        raise old_inference_keys_error(old if isinstance(old, Mapping) else {})
    rest = OmegaConf.to_container(cfg) if isinstance(cfg, DictConfig) else dict(cfg)
    rest.pop("policy", None)
    merged = merge_schema(RootConfig, rest, "config")
    if not ENV_NAME_PATTERN.fullmatch(str(merged.env.name)):
        raise ConfigError(
            f"env.name={merged.env.name!r} is not a plain name (letters, digits, '_', '-', '.'): it names "
            "the run's directory (<time>_<env>_<policy>); pick one without '/'"
        )
    for key, feat in merged.env.features.items():
        if feat.kind not in FEATURE_KINDS:
            raise ConfigError(f"env.features.{key}.kind={feat.kind!r}: expected one of {FEATURE_KINDS}")
    if not env_config(merged).output_features():
        raise ConfigError(f"env {merged.env.name!r} declares no feature of kind 'action'")
    if not merged.env.observation_keys:
        merged.env.observation_keys = _observation_keys_of_env_yaml(merged.env.name)
    _check_observation_keys(env_config(merged))
    _check_positive(merged)
    reward_range = env_config(merged).reward_range
    if reward_range is not None and (len(reward_range) != 2 or not reward_range[0] < reward_range[1]):
        raise ConfigError(
            f"env.reward_range={list(reward_range)} must be [low, high] with low < high, or null"
        )
    if merged.eval.step_timeout_s is not None and merged.eval.step_timeout_s <= 0:
        raise ConfigError(
            f"eval.step_timeout_s={merged.eval.step_timeout_s} must be a positive number or null"
        )
    _check_online_rates(merged.training)
    if merged.eval.schedule not in EVAL_SCHEDULES:
        raise ConfigError(
            f"eval.schedule={merged.eval.schedule!r}: expected one of {', '.join(EVAL_SCHEDULES)}"
        )
    _check_eval_batch_size(merged)
    for key in ("eval.use_async_envs", "training.resume", "training.use_amp"):
        value = str(OmegaConf.select(merged, key)).lower()
        if value not in ("auto", "true", "false"):
            raise ConfigError(f"{key}={value!r}: expected auto, true or false")
        OmegaConf.update(merged, key, value)
    if not DEVICE_PATTERN.fullmatch(str(merged.device)):
        raise ConfigError(f"device={merged.device!r}: expected auto, cpu, cuda, cuda:N or mps")
    if merged.recipe not in RECIPES:
        raise ConfigError(f"recipe={merged.recipe}: expected one of {', '.join(RECIPES)}")
    if merged.dataset.repo_id is not None:
        check_repo_id(merged.dataset.repo_id)
    OmegaConf.to_object(merged.inference).validate()
    return merged


def check_repo_id(repo_id: str) -> None:
    """Raise `ConfigError` unless `dataset.repo_id` is a hub id `<owner>/<name>` (`REPO_ID_PATTERN`).

    The id names directories (`$HF_LEROBOT_HOME/<repo_id>`, `<cache_dir>/lerobot_datasets/<repo_id>`), so an
    absolute path, a `..` or an empty part would put them, and the conversion that replaces one, elsewhere.
    """
    if not REPO_ID_PATTERN.fullmatch(str(repo_id)):
        raise ConfigError(
            f"dataset.repo_id={repo_id!r} is not a hub id <owner>/<name> (e.g. lerobot/pusht: two non-empty "
            "parts of letters, digits, '_', '-', '.', without '..'); a dataset directory goes in "
            "dataset.root=DIR"
        )


def policy_section(cfg: DictConfig | Mapping[str, Any]) -> dict[str, Any] | None:
    """The `policy` section of a composed, saved or validated config as a plain dict, without the env's
    features (the env section holds them); None when it has none."""
    section = cfg.get("policy")
    if not section:
        return None
    section = (
        OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else dict(section)
    )
    section.pop("input_features", None)
    section.pop("output_features", None)
    return section


def config_differences(
    a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, prefix: str = ""
) -> list[tuple[str, Any, Any]]:
    """`(dotted key, value in a, value in b)` for every leaf where two nested dicts (resolved configs)
    differ, sorted by key, each key starting with `prefix`; lists are leaves (compared whole), and a section
    that only one side has differs leaf by leaf (the other side's value is None)."""
    flat_a, flat_b = _flatten(a or {}, prefix), _flatten(b or {}, prefix)
    keys = sorted(flat_a.keys() | flat_b.keys())
    return [(k, flat_a.get(k), flat_b.get(k)) for k in keys if flat_a.get(k) != flat_b.get(k)]


def _flatten(node: Any, prefix: str) -> dict[str, Any]:
    """Nested dicts as `{prefix + dotted.key: leaf}`; an empty dict is a leaf."""
    if not isinstance(node, Mapping):
        return {prefix: node}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out.update(_flatten(v, f"{prefix}{k}." if isinstance(v, Mapping) and v else f"{prefix}{k}"))
    return out


def policy_config(cfg: DictConfig) -> PolicyConfig:
    """The validated run config's policy config as its dataclass (e.g. `DiffusionConfig`), as validation
    built it."""
    if not cfg.policy:
        raise ConfigError("the config names no policy: pass policy=<name> (e.g. policy=diffusion)")
    kind = OmegaConf.get_type(cfg.policy)
    if not (isinstance(kind, type) and issubclass(kind, PolicyConfig)):
        raise ConfigError(
            "the policy section is not validated yet: build the config with validate_run_config"
        )
    return OmegaConf.to_object(cfg.policy)


def old_inference_keys_error(settings: Mapping[str, Any]) -> ConfigError:
    """The error for `settings` (`{field: value}`) given under `policy.inference`, where they were until they
    became the run's `inference` section: it names the keys to write instead."""
    new = " ".join(f"inference.{key}={_override_text(value)}" for key, value in settings.items())
    return ConfigError(
        f"policy.inference.* is now the top-level inference.* section: write {new or 'inference.*'}"
    )


def _override_text(value: Any) -> str:
    """`value` as a command-line override writes it (`true`, not `True`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


# Keys that must be positive, and those that may also be 0 (what 0 means is in the field's comment).
POSITIVE_KEYS = (
    "eval.n_episodes",
    "training.steps",
    "training.log_freq",
    "training.save_freq",
    "training.n_envs",
    "training.train_freq",
    "training.buffer_capacity",
    "training.grad_clip_norm",
    "training.collective_timeout_s",
    "env.max_episode_steps",
)
NON_NEGATIVE_KEYS = ("training.num_workers", "eval.freq", "eval.max_episodes_rendered", "eval.start_seed")


def _check_positive(cfg: DictConfig) -> None:
    """Counts, periods and sizes are checked before any work starts: a zero or negative one would either
    crash deep inside training or silently mean something else (batch_size=0 read as "the default")."""
    for key in POSITIVE_KEYS:
        if not OmegaConf.select(cfg, key) > 0:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)} must be a positive number")
    for key in NON_NEGATIVE_KEYS:
        if OmegaConf.select(cfg, key) < 0:
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)} must be 0 or a positive number")
    batch_size = cfg.training.batch_size
    if batch_size is not None and batch_size < 1:
        raise ConfigError(
            f"training.batch_size={batch_size} must be a positive number (or null for the policy's default)"
        )
    keep = cfg.training.keep_checkpoints
    if keep is not None and keep < 1:
        raise ConfigError(
            f"training.keep_checkpoints={keep} must be a positive number (or null to keep every checkpoint)"
        )


# The online trainer's rates and exponents, (low, high, what the bounds mean) each: a NaN passes every
# comparison (a NaN `per_alpha` read as "not > 0" silently replayed uniformly), so each must be finite too.
ONLINE_RATES = {
    "per_alpha": (0.0, math.inf, "0: uniform replay"),
    "per_beta": (0.0, 1.0, "1: full bias correction"),
    "offline_ratio": (0.0, 1.0, "0: online experience only"),
    "utd_ratio": (0.0, math.inf, "or null for training.gradient_steps"),
}


def _check_online_rates(training: DictConfig) -> None:
    """Each of `ONLINE_RATES` is a finite number within its bounds (`utd_ratio` may be null)."""
    for key, (low, high, meaning) in ONLINE_RATES.items():
        value = training[key]
        if value is None and key == "utd_ratio":
            continue
        if not (math.isfinite(value) and low <= value <= high):
            bounds = f">= {low:g}" if high == math.inf else f"in [{low:g}, {high:g}]"
            raise ConfigError(f"training.{key}={value} must be a finite number {bounds} ({meaning})")


def _check_eval_batch_size(cfg: DictConfig) -> None:
    """`eval.batch_size` is a positive number of envs or `auto` (any case; stored as `auto`)."""
    value = cfg.eval.batch_size
    if str(value).lower() == "auto":
        cfg.eval.batch_size = "auto"
    elif isinstance(value, str) or value < 1:
        raise ConfigError(f"eval.batch_size={value} must be a positive number (of envs) or auto")


def _check_observation_keys(env: EnvConfig) -> None:
    """Every observation feature comes from exactly one env observation path, and every path feeds one."""
    inputs = env.input_features()
    seen: dict[str, str] = {}
    for path, key in env.observation_keys.items():
        if key not in inputs:
            raise ConfigError(
                f"env.observation_keys.{path}={key!r} is not an observation feature of env {env.name!r}; "
                f"declare it under env.features or map the path to one of {sorted(inputs)}"
            )
        if key in seen:
            raise ConfigError(f"env.observation_keys: {seen[key]!r} and {path!r} both map to {key!r}")
        seen[key] = path
    if WHOLE_OBSERVATION in env.observation_keys and len(env.observation_keys) > 1:
        raise ConfigError(
            f"env.observation_keys: {WHOLE_OBSERVATION!r} (the whole observation) cannot be combined with other paths"
        )
    for key in inputs:
        if key not in seen:
            raise ConfigError(
                f"env.observation_keys maps nothing to feature {key!r} of env {env.name!r}; add "
                f"`<observation path>: {key}` (e.g. `agent_pos: {key}`, or `.: {key}` for an array observation)"
            )


def _observation_keys_of_env_yaml(name: str) -> dict[str, str]:
    """The mapping of `configs/env/<name>.yaml`, for configs saved before `observation_keys` existed."""
    path = CONFIG_DIR / "env" / f"{name}.yaml"
    if not path.is_file():
        return {}
    return dict(OmegaConf.load(path).get("observation_keys", {}))


def env_config(cfg: DictConfig) -> EnvConfig:
    """The env section as a typed `EnvConfig` object (with its helper methods)."""
    return OmegaConf.to_object(cfg.env) if isinstance(cfg.env, DictConfig) else cfg.env


def merge_schema(schema: type, section: Any, name: str, key_prefix: str = "") -> DictConfig:
    """`section` merged into the dataclass `schema`, its defaults filled in; an unknown key or a wrong type
    is one `ConfigError`: "invalid <name> at <key_prefix><key>: <OmegaConf's first line>"."""
    try:
        return OmegaConf.merge(OmegaConf.structured(schema), section)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        where = f" at {key_prefix}{key}" if key else ""
        raise ConfigError(f"invalid {name}{where}: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0]


# The flat keys of a saved `policy` section that held these settings before `policy.inference` was a
# section, and the `InferenceConfig` field each one is.
_FLAT_KEYS = {
    "inference_fast_path": "fast",
    "inference_dtype": "dtype",
    "inference_int8_weights": "int8_weights",
    "inference_compile": "compile",
}


def upgrade_saved_config(cfg: DictConfig) -> DictConfig:
    """Move, in place, the inference settings of a run config saved by an older version (a checkpoint's
    `config.yaml`) to the top-level `inference` section; returns `cfg`.

    They were the `policy.inference` section, and before that the flat `policy.inference_*` keys
    (`inference_autocast: true` was `dtype: bfloat16`). A config that holds neither is left as it is.
    """
    policy = cfg.get("policy")
    if not isinstance(policy, DictConfig):
        return cfg
    flat = {key: policy.pop(key) for key in [*_FLAT_KEYS, "inference_autocast"] if key in policy}
    section = dict(policy.pop("inference", None) or {})
    section.update({field: flat[key] for key, field in _FLAT_KEYS.items() if key in flat})
    if flat.get("inference_autocast"):
        section["dtype"] = "bfloat16"
    if section:
        cfg.inference = {**section, **cfg.get("inference", {})}
    return cfg
