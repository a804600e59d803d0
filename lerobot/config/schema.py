"""The run config's schema: one dataclass per root section (env, dataset, training, eval, inference, wandb)
and `RootConfig`, the root every composed config is merged into. Each field's comment says what it means;
the `policy` section is typed by the chosen policy's own dataclass (a `lerobot.config.policy.PolicyConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lerobot.constants import ACTION_KIND, STATE
from lerobot.errors import ConfigError

# `env.observation_keys` path that stands for the whole observation of an env whose observation is one
# array rather than a dict (e.g. Pendulum's).
WHOLE_OBSERVATION = "."
# Where the YAML configs live (Hydra's primary config directory).
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
# Values `recipe` accepts (the rule: `lerobot.cli.recipes`), and the environment variable holding its default.
RECIPES = ("auto", "cpu", "paper")
RECIPE_ENV = "LEROBOT_RECIPE"


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

    `name`, `gym_id`, `fps` and `max_episode_steps` hold no default, no benchmark's values: each env config
    (`configs/env/<name>.yaml`) states them, and validation refuses a config that leaves one unset.
    """

    name: str | None = None
    gym_id: str | None = None
    fps: int | None = None
    max_episode_steps: int | None = None
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
    # LeRobotDataset on the Hugging Face hub, e.g. `lerobot/pusht` (docs/lerobot_dataset_io.md): `<owner>/<name>`
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
    # (docs/run_checkpoints.md). 3: the paper-size image model writes 4.9 GB per checkpoint, so a default run
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
