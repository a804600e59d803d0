"""Generate LeRobot Diffusion Policy checkpoints and reference outputs with LeRobot itself.

Runs in a separate environment that has LeRobot 0.6.x installed (Python >= 3.12), NOT in this project's
environment; it imports nothing from this project. It writes, under `--out`:

- `pretrained_model/`: what LeRobot's training saves for a policy (`config.json`, `model.safetensors`,
  `policy_preprocessor.json`, `policy_postprocessor.json` and their normalizer state files).
- `reference.safetensors`: for a fixed raw observation batch, LeRobot's normalized observations, global
  conditioning `(B, n_obs_steps * F)`, initial noise, denoised normalized actions `(B, horizon, A)` and the
  unnormalized action chunk `(B, n_action_steps, A)`, all computed with a generator seeded with `--seed`
  and a deterministic DDIM schedule (`--scheduler DDPM`: LeRobot's DDPM sampler with all its steps, which
  draws from the generator at every step). The metadata holds the seed, the scheduler and the LeRobot /
  torch versions.

The weights are LeRobot's initialization plus a small random perturbation, so that normalization layers
(initialized to 1 and 0) do not hide a wrong mapping.

    python scripts/make_lerobot_fixtures.py --kind keypoints --out tests/fixtures/lerobot_diffusion_keypoints
    python scripts/make_lerobot_fixtures.py --kind image --out tests/fixtures/lerobot_diffusion_image --names-only

`--names-only` keeps, instead of the weights (a ResNet-18 is ~45 MB) and the reference outputs,
`model_names.json`: every weight name of LeRobot's `model.safetensors` with its shape.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# LeRobot's package has this project's top-level name: make sure the installed one is imported.
import lerobot

if Path(lerobot.__file__).resolve().parents[1] == Path(__file__).resolve().parents[1]:
    raise SystemExit(
        "this imported the project's own `lerobot`: run with LeRobot installed and PYTHONPATH unset"
    )

from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature  # noqa: E402
from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig  # noqa: E402
from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy  # noqa: E402

from lerobot.policies.factory import make_pre_post_processors  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("keypoints", "image", "image_keypoints"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--scheduler", choices=("DDIM", "DDPM"), default="DDIM")
    parser.add_argument("--names-only", action="store_true", help="keep weight names and shapes, not weights")
    args = parser.parse_args()

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

    model_dir = args.out / "pretrained_model"
    if args.out.exists():
        shutil.rmtree(args.out)
    model_dir.mkdir(parents=True)
    policy.save_pretrained(model_dir)
    preprocessor.save_pretrained(model_dir)
    postprocessor.save_pretrained(model_dir)

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
    if args.names_only:
        names = {k: list(v.shape) for k, v in load_file(model_dir / "model.safetensors").items()}
        (args.out / "model_names.json").write_text(
            json.dumps({"metadata": metadata, "names": names}, indent=1)
        )
        (model_dir / "model.safetensors").unlink()
    else:
        save_file(
            {k: v.contiguous() for k, v in tensors.items()}, args.out / "reference.safetensors", metadata
        )
    print(f"wrote {args.out} (lerobot {lerobot.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
