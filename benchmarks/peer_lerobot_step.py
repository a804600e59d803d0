"""LeRobot's Diffusion Policy or ACT training step, timed on request: the peer side of `bench_peer.py`.

Runs under a Python that has LeRobot 0.6.x installed (not this project's environment; it imports nothing
from this project). It builds LeRobot's `DiffusionPolicy` with its PushT image setup (ResNet-18 with group norm,
U-Net 512/1024/2048, crop 84, batch 64, 2 observation steps, horizon 16), or its `ACTPolicy` with its
defaults on PushT's image and state (batch 8), with their optimizer and LR presets, and then answers one
line per request on stdin:

    fp32 | bf16   ->  seconds of one update (forward, backward, clipping, optimizer, LR schedule)
    quit

The update is the body of LeRobot's `update_policy` (`lerobot_train.py`) without its accelerator: on a CPU
`accelerator.autocast()` with bf16 mixed precision is `torch.autocast("cpu", dtype=torch.bfloat16)`, and
`accelerator.backward` is `loss.backward()`. The batch is random, already normalized (LeRobot normalizes in
its preprocessor, outside the update).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import lerobot

if Path(lerobot.__file__).resolve().parents[1] == Path(__file__).resolve().parents[1]:
    raise SystemExit("this imported the project's own `lerobot`: run with LeRobot's Python, PYTHONPATH unset")

from lerobot.configs.types import FeatureType, PolicyFeature  # noqa: E402
from lerobot.policies.act.configuration_act import ACTConfig  # noqa: E402
from lerobot.policies.act.modeling_act import ACTPolicy  # noqa: E402
from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig  # noqa: E402
from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy  # noqa: E402

BATCH, N_OBS, HORIZON = 64, 2, 16
ACT_BATCH = 8
# PushT's 96x96 camera and agent position in, the 2-D action out, on the CPU: both policies' setup.
PUSHT_IMAGE = {
    "input_features": {
        "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(2,)),
        "observation.image": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 96, 96)),
    },
    "output_features": {"action": PolicyFeature(type=FeatureType.ACTION, shape=(2,))},
    "device": "cpu",
    "push_to_hub": False,
}


def diffusion_config(**overrides) -> DiffusionConfig:
    """LeRobot's `DiffusionConfig` with its PushT image setup (its hub checkpoint `lerobot/diffusion_pusht`),
    which differs from the class defaults, and `overrides`; ImageNet weights (the same compute) would need a
    download."""
    return DiffusionConfig(
        **PUSHT_IMAGE,
        horizon=HORIZON,
        n_action_steps=8,
        crop_shape=(84, 84),
        use_group_norm=True,
        pretrained_backbone_weights=None,
        **overrides,
    )


def diffusion_setup():
    """LeRobot's Diffusion Policy with its PushT image setup and a random batch of 64."""
    config = diffusion_config()
    torch.manual_seed(0)
    policy = DiffusionPolicy(config)
    batch = {
        "observation.state": torch.randn(BATCH, N_OBS, 2),
        "observation.image": torch.rand(BATCH, N_OBS, 3, 96, 96) * 2 - 1,
        "action": torch.rand(BATCH, HORIZON, 2) * 2 - 1,
        "action_is_pad": torch.zeros(BATCH, HORIZON, dtype=torch.bool),
    }
    return config, policy, batch


def act_setup():
    """LeRobot's ACT with its defaults (the paper's model: chunks of 100, ResNet-18 from scratch, batch 8)
    on PushT's 96x96 image and agent position, and a random batch of 8."""
    config = ACTConfig(
        **PUSHT_IMAGE,
        pretrained_backbone_weights=None,
    )
    torch.manual_seed(0)
    policy = ACTPolicy(config)
    chunk = config.chunk_size
    batch = {
        "observation.state": torch.randn(ACT_BATCH, 2),
        "observation.image": torch.rand(ACT_BATCH, 3, 96, 96) * 2 - 1,
        "action": torch.rand(ACT_BATCH, chunk, 2) * 2 - 1,
        "action_is_pad": torch.zeros(ACT_BATCH, chunk, dtype=torch.bool),
    }
    return config, policy, batch


def main() -> None:
    """Build the policy (argv: threads, then `diffusion` or `act`), print `ready <parameters>`, then serve
    timing requests until `quit`."""
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads())
    name = sys.argv[2] if len(sys.argv) > 2 else "diffusion"
    config, policy, batch = {"diffusion": diffusion_setup, "act": act_setup}[name]()
    optimizer = config.get_optimizer_preset().build(policy.get_optim_params())
    scheduler_preset = config.get_scheduler_preset()  # ACT has none (a constant learning rate)
    scheduler = scheduler_preset.build(optimizer, num_training_steps=100_000) if scheduler_preset else None
    grad_clip_norm = config.get_optimizer_preset().grad_clip_norm
    print(f"ready {sum(p.numel() for p in policy.parameters())}", flush=True)
    for line in sys.stdin:
        mode = line.strip()
        if mode == "quit":
            break
        start = time.perf_counter()
        policy.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16"):
            loss, _ = policy.forward(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad()
        if scheduler is not None:
            scheduler.step()
        loss.item()
        print(time.perf_counter() - start, flush=True)


if __name__ == "__main__":
    main()
