"""Generate LeRobot checkpoints, datasets and reference outputs with LeRobot itself.

Runs in a separate environment that has LeRobot 0.6.x installed (Python >= 3.12), NOT in this project's
environment; it imports nothing from this project. Three families of `--kind`:

Diffusion Policy (`keypoints`, `image`, `image_keypoints`) writes, under `--out`:

- `pretrained_model/`: what LeRobot's training saves for a policy (`config.json`, `model.safetensors`,
  `policy_preprocessor.json`, `policy_postprocessor.json` and their normalizer state files).
- `reference.safetensors`: for a fixed raw observation batch, LeRobot's normalized observations, global
  conditioning `(B, n_obs_steps * F)`, initial noise, denoised normalized actions `(B, horizon, A)` and the
  unnormalized action chunk `(B, n_action_steps, A)`, all computed with a generator seeded with `--seed`
  and a deterministic DDIM schedule (`--scheduler DDPM`: LeRobot's DDPM sampler with all its steps, which
  draws from the generator at every step). The metadata holds the seed, the scheduler and the LeRobot /
  torch versions.

ACT (`act_keypoints`: state + 16-d environment state; `act_image`: a 96x96 camera + state) writes the same
`pretrained_model/` (a small transformer: dim_model 32, 2 encoder layers, 1 decoder layer, 1 VAE encoder
layer, chunks of 10 actions, all executed) and a `reference.safetensors` holding, for raw observations
`raw.<key>` `(B, ...)`, LeRobot's unnormalized chunk `action_chunk` `(B, chunk_size, A)` (from
`predict_action_chunk`); and, for a sequence of raw observations `steps.<key>` `(T, B, ...)` fed one step at
a time through LeRobot's preprocessor, `select_action` and postprocessor, the executed actions
`steps.actions` `(T, B, A)` with plain chunking and `steps.actions_ensembled` with
`temporal_ensemble_coeff=0.01, n_action_steps=1` (the same weights). The image model's statistics are
ImageNet's, as LeRobot's training puts them in place of the dataset's by default (`use_imagenet_stats`).
`--set FIELD=JSON` changes another ACT config value (e.g. `--set pre_norm=true`, `--set use_vae=false`).

The weights are LeRobot's initialization plus a small random perturbation (frozen BatchNorm buffers
included), so that normalization layers (initialized to 1 and 0) do not hide a wrong mapping.

LeRobotDatasets with images in their parquet files, recorded by `LeRobotDataset.create(...,
use_videos=False)`, `add_frame` and `save_episode` into `dataset/` (PNG bytes in the parquet rows), with
what LeRobot's own `LeRobotDataset` returns for every frame in `reference.safetensors`:

- `dataset_images`: 3 short episodes of a 3x16x16 camera, a 2-d state and a 2-d action; the reference holds
  `observation.image` float32 `(N, 3, 16, 16)` in [0, 1], the vectors, `episode_index`, `frame_index`.
- `metaworld`: laid out as LeRobot's `lerobot/metaworld_mt50` (its `meta/info.json`, codebase v3.0, 80 fps,
  robot_type `metaworld`): `observation.image` declared channels-first `[3, H, W]` with names
  `[channels, height, width]`, `observation.state` (4: hand position and gripper),
  `observation.environment_state` (39), `action` (4: x, y, z, gripper), `next.reward`, `next.success` and
  `task_id` (int16, LeRobot's MetaWorld task number); the camera is 32x32 instead of 480x480 to keep the
  fixture small. 4 episodes of 5, 4, 6 and 3 frames alternate two tasks, each episode's task LeRobot's
  natural-language description of its MetaWorld task, as in `lerobot/metaworld_mt50` (49 descriptions for 50
  tasks there: push-v3 and push-back-v3 share one). The reference holds the image as uint8 (LeRobot returns
  it as float32 in [0, 1]; the script checks that value / 255 gives LeRobot's exactly), the vectors,
  `next.reward`, `task_id`, `task_index`, `episode_index`, `frame_index`; its metadata each frame's `task`
  string (JSON list), the LeRobot and torch versions and the seed.

    python scripts/make_lerobot_fixtures.py --kind keypoints --out tests/fixtures/lerobot_diffusion_keypoints
    python scripts/make_lerobot_fixtures.py --kind image --out tests/fixtures/lerobot_diffusion_image --names-only
    python scripts/make_lerobot_fixtures.py --kind act_keypoints --out tests/fixtures/lerobot_act_keypoints
    python scripts/make_lerobot_fixtures.py --kind act_image --out tests/fixtures/lerobot_act_image --names-only
    python scripts/make_lerobot_fixtures.py --kind dataset_images --out tests/fixtures/lerobot_dataset_images
    python scripts/make_lerobot_fixtures.py --kind metaworld --seed 0 --out tests/fixtures/lerobot_metaworld

An environment for the dataset kinds (run from another directory than this repository, so that LeRobot's
`lerobot` is imported; the policy kinds also need what LeRobot's policies import, e.g. diffusers):

    python3.12 -m venv /tmp/lr312
    /tmp/lr312/bin/pip install torch==2.14.1 torchvision==0.29.1
    /tmp/lr312/bin/pip install --no-deps lerobot==0.6.1
    /tmp/lr312/bin/pip install draccus datasets pandas pyarrow av jsonlines termcolor "huggingface-hub<2" \
        "numpy<2.3" "Pillow<13" opencv-python-headless einops gymnasium safetensors

`--names-only` keeps, instead of the weights (a ResNet-18 is ~45 MB) and the reference outputs,
`model_names.json`: every weight name of LeRobot's `model.safetensors` with its shape.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torchvision.ops.misc import FrozenBatchNorm2d

# LeRobot's package has this project's top-level name: make sure the installed one is imported.
import lerobot

if Path(lerobot.__file__).resolve().parents[1] == Path(__file__).resolve().parents[1]:
    raise SystemExit(
        "this imported the project's own `lerobot`: run with LeRobot installed and PYTHONPATH unset"
    )

from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature  # noqa: E402
from lerobot.utils.constants import IMAGENET_STATS  # noqa: E402

# The policies are imported by the kinds that make them: the dataset kinds run without their dependencies.
if TYPE_CHECKING:
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

BATCH = 4
N_OBS_STEPS = 2
HORIZON = 16
N_ACTION_STEPS = 8
DDIM_STEPS = 10


def _features(kind: str) -> tuple[dict[str, PolicyFeature], dict[str, tuple[float, float]]]:
    """Input features and a (low, high) range per feature used for the statistics and the batch."""
    inputs = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(2,))}
    ranges = {"observation.state": (10.0, 500.0)}
    if kind in ("image", "image_keypoints"):
        inputs["observation.image"] = PolicyFeature(type=FeatureType.VISUAL, shape=(3, 96, 96))
        ranges["observation.image"] = (0.0, 1.0)
    if kind in ("keypoints", "image_keypoints"):
        inputs["observation.environment_state"] = PolicyFeature(type=FeatureType.ENV, shape=(16,))
        ranges["observation.environment_state"] = (30.0, 480.0)
    return inputs, ranges


def _config(kind: str, scheduler: str) -> DiffusionConfig:
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

    inputs, _ = _features(kind)
    common = dict(
        input_features=inputs,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(2,))},
        device="cpu",
        n_obs_steps=N_OBS_STEPS,
        horizon=HORIZON,
        n_action_steps=N_ACTION_STEPS,
        noise_scheduler_type=scheduler,
        num_inference_steps=DDIM_STEPS if scheduler == "DDIM" else None,
        push_to_hub=False,
    )
    # The environment state is normalized too (LeRobot's default mapping, kept for images, leaves it as is).
    if kind != "image":
        common["normalization_mapping"] = {
            **({"VISUAL": NormalizationMode.MEAN_STD} if kind == "image_keypoints" else {}),
            "STATE": NormalizationMode.MIN_MAX,
            "ENV": NormalizationMode.MIN_MAX,
            "ACTION": NormalizationMode.MIN_MAX,
        }
    if kind == "keypoints":
        return DiffusionConfig(**common, down_dims=(16, 32, 64), diffusion_step_embed_dim=32)
    return DiffusionConfig(
        **common,
        down_dims=(32, 64, 128),
        diffusion_step_embed_dim=32,
        crop_shape=(84, 84),
        pretrained_backbone_weights=None,
        use_group_norm=True,
        use_separate_rgb_encoder_per_camera=False,
        spatial_softmax_num_keypoints=16,
    )


def _stats(kind: str, generator: torch.Generator) -> dict[str, dict[str, torch.Tensor]]:
    inputs, ranges = _features(kind)
    stats = {}
    for key, feature in inputs.items():
        low, high = ranges[key]
        if feature.type == FeatureType.VISUAL:
            channels = feature.shape[0]
            stats[key] = {
                "mean": 0.4 + 0.2 * torch.rand(channels, 1, 1, generator=generator),
                "std": 0.2 + 0.1 * torch.rand(channels, 1, 1, generator=generator),
                "min": torch.zeros(channels, 1, 1),
                "max": torch.ones(channels, 1, 1),
            }
        else:
            lo = low + 20 * torch.rand(feature.shape, generator=generator)
            hi = high - 20 * torch.rand(feature.shape, generator=generator)
            stats[key] = {"min": lo, "max": hi, "mean": (lo + hi) / 2, "std": (hi - lo) / 4}
    lo = 15 + 10 * torch.rand(2, generator=generator)
    hi = 490 - 10 * torch.rand(2, generator=generator)
    stats["action"] = {"min": lo, "max": hi, "mean": (lo + hi) / 2, "std": (hi - lo) / 4}
    return stats


def _observations(kind: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Raw observations `(B, n_obs_steps, ...)` inside the statistics' ranges."""
    inputs, ranges = _features(kind)
    batch = {}
    for key, feature in inputs.items():
        low, high = ranges[key]
        batch[key] = low + (high - low) * torch.rand(
            (BATCH, N_OBS_STEPS, *feature.shape), generator=generator
        )
    return batch


def _diffusion(args: argparse.Namespace) -> None:
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.policies.factory import make_pre_post_processors

    torch.manual_seed(args.seed)
    data_gen = torch.Generator().manual_seed(args.seed + 1)
    config = _config(args.kind, args.scheduler)
    policy = DiffusionPolicy(config)
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=data_gen))
    policy.eval()
    stats = _stats(args.kind, data_gen)
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)

    model_dir = _save_pretrained(args.out, policy, preprocessor, postprocessor)

    raw = _observations(args.kind, data_gen)
    normalized = preprocessor(dict(raw))
    batch = {k: normalized[k] for k in raw}
    images = [k for k in config.image_features]
    if images:
        batch["observation.images"] = torch.stack([batch[k] for k in images], dim=-4)
    with torch.no_grad():
        global_cond = policy.diffusion._prepare_global_conditioning(batch)
        noise = torch.randn(
            (BATCH, HORIZON, 2), generator=torch.Generator().manual_seed(args.seed)
        )  # what the sampler's first draw is
        sample = policy.diffusion.conditional_sample(
            BATCH, global_cond=global_cond, generator=torch.Generator().manual_seed(args.seed)
        )
        start = N_OBS_STEPS - 1
        chunk = postprocessor(sample[:, start : start + N_ACTION_STEPS])

    tensors = {f"raw.{k}": v for k, v in raw.items()}
    tensors.update({f"normalized.{k}": v for k, v in batch.items() if k in raw})
    tensors.update(
        {
            "global_cond": global_cond,
            "initial_noise": noise,
            "actions_normalized": sample,
            "action_chunk": chunk,
        }
    )
    metadata = {
        "seed": str(args.seed),
        "lerobot_version": lerobot.__version__,
        "torch_version": torch.__version__,
        "kind": args.kind,
        "scheduler": args.scheduler,
    }
    _write_outputs(args, model_dir, tensors, metadata)


def _fresh(out: Path) -> None:
    """Make `out` an empty directory (what was there is replaced)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)


def _save_pretrained(out: Path, policy, preprocessor, postprocessor) -> Path:
    """Save what LeRobot's training saves into `out/pretrained_model` (`out` replaced); return that directory."""
    _fresh(out)
    model_dir = out / "pretrained_model"
    model_dir.mkdir()
    policy.save_pretrained(model_dir)
    preprocessor.save_pretrained(model_dir)
    postprocessor.save_pretrained(model_dir)
    return model_dir


def _save_reference(out: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """`out/reference.safetensors`: the `tensors` (made contiguous) with the header `metadata`."""
    save_file({k: v.contiguous() for k, v in tensors.items()}, out / "reference.safetensors", metadata)


def _write_outputs(
    args: argparse.Namespace, model_dir: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> None:
    """`reference.safetensors`, or with `--names-only` `model_names.json` in place of it and of the weights."""
    if args.names_only:
        names = {k: list(v.shape) for k, v in load_file(model_dir / "model.safetensors").items()}
        (args.out / "model_names.json").write_text(
            json.dumps({"metadata": metadata, "names": names}, indent=1)
        )
        (model_dir / "model.safetensors").unlink()
    else:
        _save_reference(args.out, tensors, metadata)


# ------------------------------------------------------------------------------------------------ ACT
ACT_BATCH = 3
ACT_CHUNK = 10
ACT_STEPS = 15
ENSEMBLE_COEFF = 0.01


def _act_features(kind: str) -> tuple[dict[str, PolicyFeature], dict[str, tuple[float, float]]]:
    """Input features of an ACT kind and a (low, high) range per feature for the statistics and the batch."""
    inputs = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(2,))}
    ranges = {"observation.state": (10.0, 500.0)}
    if kind == "act_image":
        inputs["observation.image"] = PolicyFeature(type=FeatureType.VISUAL, shape=(3, 96, 96))
        ranges["observation.image"] = (0.0, 1.0)
    else:
        inputs["observation.environment_state"] = PolicyFeature(type=FeatureType.ENV, shape=(16,))
        ranges["observation.environment_state"] = (30.0, 480.0)
    return inputs, ranges


def _act_config(kind: str, **overrides) -> ACTConfig:
    """A small ACT with LeRobot's defaults otherwise (its normalization mapping leaves ENV unnormalized)."""
    from lerobot.policies.act.configuration_act import ACTConfig

    inputs, _ = _act_features(kind)
    settings = dict(
        input_features=inputs,
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(2,))},
        device="cpu",
        push_to_hub=False,
        chunk_size=ACT_CHUNK,
        n_action_steps=ACT_CHUNK,
        dim_model=32,
        n_heads=4,
        dim_feedforward=64,
        n_encoder_layers=2,
        n_decoder_layers=1,
        n_vae_encoder_layers=1,
        latent_dim=8,
        pretrained_backbone_weights=None,
    )
    settings.update(overrides)
    return ACTConfig(**settings)


def _act_stats(kind: str, generator: torch.Generator) -> dict[str, dict[str, torch.Tensor]]:
    inputs, ranges = _act_features(kind)
    stats = {}
    for key, feature in inputs.items():
        if feature.type == FeatureType.VISUAL:
            # What LeRobot's training puts in place of the dataset's image statistics by default.
            stats[key] = {name: torch.tensor(value) for name, value in IMAGENET_STATS.items()}
            stats[key].update(min=torch.zeros(3, 1, 1), max=torch.ones(3, 1, 1))
            continue
        low, high = ranges[key]
        lo = low + 20 * torch.rand(feature.shape, generator=generator)
        hi = high - 20 * torch.rand(feature.shape, generator=generator)
        stats[key] = {"min": lo, "max": hi, "mean": (lo + hi) / 2, "std": (hi - lo) / 4}
    lo = 15 + 10 * torch.rand(2, generator=generator)
    hi = 490 - 10 * torch.rand(2, generator=generator)
    stats["action"] = {"min": lo, "max": hi, "mean": (lo + hi) / 2, "std": (hi - lo) / 4}
    return stats


def _act_observations(
    kind: str, leading: tuple[int, ...], generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """Raw observations `(*leading, ...)` inside the statistics' ranges."""
    inputs, ranges = _act_features(kind)
    batch = {}
    for key, feature in inputs.items():
        low, high = ranges[key]
        batch[key] = low + (high - low) * torch.rand((*leading, *feature.shape), generator=generator)
    return batch


def _perturb(policy: torch.nn.Module, generator: torch.Generator) -> None:
    """Add small noise to every parameter and to the frozen BatchNorm buffers (the variance multiplied, so it
    stays positive); the VAE encoder's fixed sinusoidal positions stay LeRobot's."""
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
        for module in policy.modules():
            if isinstance(module, FrozenBatchNorm2d):
                for buffer in (module.weight, module.bias, module.running_mean):
                    buffer.add_(0.05 * torch.randn(buffer.shape, generator=generator))
                module.running_var.mul_(
                    torch.exp(0.05 * torch.randn(module.running_var.shape, generator=generator))
                )


def _executed_actions(policy, preprocessor, postprocessor, steps: dict[str, torch.Tensor]) -> torch.Tensor:
    """`(T, B, A)`: what LeRobot's evaluation loop executes for the observation sequence `steps` (T, B, ...)."""
    policy.reset()
    actions = []
    n_steps = next(iter(steps.values())).shape[0]
    with torch.no_grad():
        for t in range(n_steps):
            batch = preprocessor({key: value[t] for key, value in steps.items()})
            actions.append(postprocessor(policy.select_action(batch)))
    return torch.stack(actions)


def _parse_setting(text: str) -> tuple[str, object]:
    """`FIELD=VALUE` of `--set`, the value read as JSON (`pre_norm=true`, `use_vae=false`)."""
    field, _, value = text.partition("=")
    return field, json.loads(value)


def _act(args: argparse.Namespace) -> None:
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    torch.manual_seed(args.seed)
    data_gen = torch.Generator().manual_seed(args.seed + 1)
    settings = dict(_parse_setting(text) for text in args.set)
    config = _act_config(args.kind, **settings)
    policy = ACTPolicy(config)
    _perturb(policy, data_gen)
    policy.eval()
    stats = _act_stats(args.kind, data_gen)
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)

    model_dir = _save_pretrained(args.out, policy, preprocessor, postprocessor)

    raw = _act_observations(args.kind, (ACT_BATCH,), data_gen)
    with torch.no_grad():
        chunk = postprocessor(policy.predict_action_chunk(preprocessor(dict(raw))))
    steps = _act_observations(args.kind, (ACT_STEPS, ACT_BATCH), data_gen)
    executed = _executed_actions(policy, preprocessor, postprocessor, steps)
    ensembling = ACTPolicy(
        _act_config(args.kind, **settings, temporal_ensemble_coeff=ENSEMBLE_COEFF, n_action_steps=1)
    )
    ensembling.load_state_dict(policy.state_dict())
    ensembling.eval()
    ensembled = _executed_actions(ensembling, preprocessor, postprocessor, steps)

    tensors = {f"raw.{k}": v for k, v in raw.items()}
    tensors.update({f"steps.{k}": v for k, v in steps.items()})
    tensors.update({"action_chunk": chunk, "steps.actions": executed, "steps.actions_ensembled": ensembled})
    metadata = {
        "seed": str(args.seed),
        "lerobot_version": lerobot.__version__,
        "torch_version": torch.__version__,
        "kind": args.kind,
        "temporal_ensemble_coeff": str(ENSEMBLE_COEFF),
        "settings": json.dumps(settings),
    }
    _write_outputs(args, model_dir, tensors, metadata)


# ------------------------------------------------------------------------------------------------ datasets
DATASET_LENGTHS = (4, 6, 5)
DATASET_FPS = 10
IMAGE_SIZE = 16

METAWORLD_FPS = 80
METAWORLD_IMAGE_SIZE = 32
METAWORLD_LENGTHS = (5, 4, 6, 3)
# Episode e's task, MetaWorld name -> (LeRobot's description, LeRobot's task number), as in metaworld_mt50.
METAWORLD_TASKS = {
    "reach-v3": ("Reach a goal position", 40),
    "drawer-close-v3": ("Push and close a drawer", 17),
}
METAWORLD_EPISODE_TASKS = ("reach-v3", "drawer-close-v3", "reach-v3", "drawer-close-v3")
METAWORLD_REFERENCE_KEYS = (
    "observation.state",
    "observation.environment_state",
    "action",
    "next.reward",
    "task_id",
    "task_index",
    "episode_index",
    "frame_index",
)


def _record_images_dataset(
    root: Path, repo_id: str, features: dict[str, dict], episodes: Iterable[Iterable[dict]], **create: Any
) -> list[dict]:
    """Record `episodes` (each an iterable of frames) with LeRobot's writer, images in the parquet files
    (`use_videos=False`; `create`: more `LeRobotDataset.create` arguments); return what LeRobot's own
    loader gives for every frame."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset.create(repo_id, features=features, root=root, use_videos=False, **create)
    for frames in episodes:
        for frame in frames:
            dataset.add_frame(frame)
        dataset.save_episode()
    dataset.finalize()
    # The PNG files the recorder wrote are in the parquet files now; only their empty folders are left.
    if not any(path.is_file() for path in (root / "images").rglob("*")):
        shutil.rmtree(root / "images", ignore_errors=True)
    loaded = LeRobotDataset(repo_id, root=root)
    return [loaded[i] for i in range(len(loaded))]


def _dataset_images(args: argparse.Namespace) -> None:
    """A LeRobotDataset with PNG images in its parquet files, and what LeRobot's loader returns for it."""
    features = {
        "observation.image": {
            "dtype": "image",
            "shape": (IMAGE_SIZE, IMAGE_SIZE, 3),
            "names": ["height", "width", "channels"],
        },
        "observation.state": {"dtype": "float32", "shape": (2,), "names": None},
        "action": {"dtype": "float32", "shape": (2,), "names": None},
    }
    rng = np.random.default_rng(args.seed)

    def frames(length: int) -> Iterator[dict]:
        for _ in range(length):
            yield {
                # Every value 0..255 occurs: a decoder that rescales or rounds would show.
                "observation.image": rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8),
                "observation.state": rng.uniform(0, 512, 2).astype(np.float32),
                "action": rng.uniform(0, 512, 2).astype(np.float32),
                "task": "tiny",
            }

    _fresh(args.out)
    episodes = (frames(length) for length in DATASET_LENGTHS)
    items = _record_images_dataset(args.out / "dataset", "test/images", features, episodes, fps=DATASET_FPS)
    keys = ["observation.image", "observation.state", "action", "episode_index", "frame_index"]
    tensors = {key: torch.stack([item[key] for item in items]) for key in keys}
    metadata = {"lerobot_version": lerobot.__version__, "kind": args.kind, "seed": str(args.seed)}
    _save_reference(args.out, tensors, metadata)


def _metaworld_features() -> dict[str, dict]:
    """The features of `lerobot/metaworld_mt50` (its info.json), with a 32x32 camera."""
    size = METAWORLD_IMAGE_SIZE
    return {
        "observation.image": {
            "dtype": "image",
            "shape": (3, size, size),
            "names": ["channels", "height", "width"],
        },
        "observation.state": {"dtype": "float32", "shape": (4,), "names": {"axes": None}},
        "observation.environment_state": {"dtype": "float32", "shape": (39,), "names": ["keypoints"]},
        "action": {"dtype": "float32", "shape": (4,), "names": {"axes": ["x", "y", "z", "gripper"]}},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
        "next.success": {"dtype": "bool", "shape": (1,), "names": None},
        "task_id": {"dtype": "int16", "shape": (1,), "names": None},
    }


def _metaworld(args: argparse.Namespace) -> None:
    """A LeRobotDataset laid out as LeRobot's `lerobot/metaworld_mt50`, and what LeRobot's loader returns."""
    rng = np.random.default_rng(args.seed)
    size = METAWORLD_IMAGE_SIZE

    def frames(task: str, length: int) -> Iterator[dict]:
        description, number = METAWORLD_TASKS[task]
        for frame in range(length):
            yield {
                # Every value 0..255 occurs: a decoder that rescales or rounds would show.
                "observation.image": rng.integers(0, 256, (3, size, size), dtype=np.uint8),
                "observation.state": rng.uniform(-1, 1, 4).astype(np.float32),
                "observation.environment_state": rng.uniform(-1, 1, 39).astype(np.float32),
                "action": rng.uniform(-1, 1, 4).astype(np.float32),
                "next.reward": np.array([rng.uniform(0, 10)], dtype=np.float32),
                "next.success": np.array([frame == length - 1]),
                "task_id": np.array([number], dtype=np.int16),
                "task": description,
            }

    _fresh(args.out)
    episodes = (frames(task, length) for task, length in zip(METAWORLD_EPISODE_TASKS, METAWORLD_LENGTHS))
    items = _record_images_dataset(
        args.out / "dataset",
        "test/metaworld_mt50",
        _metaworld_features(),
        episodes,
        fps=METAWORLD_FPS,
        robot_type="metaworld",
    )
    images = torch.stack([item["observation.image"] for item in items])
    as_uint8 = torch.round(images * 255).to(torch.uint8)
    if not torch.equal(as_uint8.float() / 255, images):
        raise SystemExit("LeRobot's images are not value / 255 of uint8 pixels")
    tensors = {"observation.image": as_uint8}
    tensors.update(
        {key: torch.stack([torch.as_tensor(item[key]) for item in items]) for key in METAWORLD_REFERENCE_KEYS}
    )
    metadata = {
        "lerobot_version": lerobot.__version__,
        "torch_version": torch.__version__,
        "seed": str(args.seed),
        "tasks": json.dumps([item["task"] for item in items]),
    }
    _save_reference(args.out, tensors, metadata)


KINDS = {
    "keypoints": _diffusion,
    "image": _diffusion,
    "image_keypoints": _diffusion,
    "act_keypoints": _act,
    "act_image": _act,
    "dataset_images": _dataset_images,
    "metaworld": _metaworld,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=tuple(KINDS), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--scheduler", choices=("DDIM", "DDPM"), default="DDIM", help="diffusion only")
    parser.add_argument("--names-only", action="store_true", help="keep weight names and shapes, not weights")
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=JSON", help="ACT only: another config value"
    )
    args = parser.parse_args()
    KINDS[args.kind](args)
    print(f"wrote {args.out} (lerobot {lerobot.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
