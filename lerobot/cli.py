"""Command-line entry points behind `scripts/train.py` and `scripts/eval.py`.

Configs are composed with Hydra's compose API from `configs/` (groups `env=` and `policy=`, dotted
overrides such as `training.steps=100`), then validated against `lerobot.config`. Expected failures (bad
config, missing data or checkpoint, a dead env worker, a diverged loss) print one line and exit non-zero.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lerobot.config import ConfigError, env_config, validate_config

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
GROUPS = ("env", "policy")


def compose_config(overrides: list[str], config_dir: Path = CONFIG_DIR) -> DictConfig:
    """Compose `configs/default.yaml` with Hydra overrides and validate it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose(config_name="default", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_hydra_message(e)) from None
    return validate_config(cfg)


def _hydra_message(e: Exception) -> str:
    text = str(e).strip().splitlines()[0]
    if "Could not find" in text or "not found" in text.lower():
        for group in GROUPS:
            if f"'{group}/" in text:
                options = sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))
                return f"{text}; available {group} options: {', '.join(options)}"
    return text


def _expected_errors() -> tuple[type[BaseException], ...]:
    from lerobot.rollout import EnvWorkerError
    from lerobot.training.checkpoint import CheckpointError
    from lerobot.training.common import TrainingDivergedError

    errors: list[type[BaseException]] = [
        ConfigError,
        CheckpointError,
        EnvWorkerError,
        TrainingDivergedError,
        FileNotFoundError,
    ]
    try:
        from lerobot.datasets import DatasetError

        errors.append(DatasetError)
    except ImportError:
        pass
    return tuple(errors)


def _run(main, argv: list[str] | None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    try:
        return main(argv)
    except _expected_errors() as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


# ----------------------------------------------------------------------------------------------- train
def _train(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        description="Train a policy.", epilog="example: policy=diffusion env=pusht training.steps=1000"
    )
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. policy=diffusion env=pusht training.steps=100"
    )
    args = parser.parse_args(argv)
    cfg = compose_config(args.overrides)
    from lerobot.training import train

    run_dir = train(cfg)
    print(f"run directory: {run_dir}")
    return 0


def train_main(argv: list[str] | None = None) -> int:
    """`scripts/train.py`: compose the config and train; returns the exit code."""
    return _run(_train, argv)


# ------------------------------------------------------------------------------------------------ eval
def checkpoint_config(ckpt_dir: Path, overrides: list[str]) -> DictConfig:
    """The checkpoint's config with evaluation overrides; `env=NAME` swaps in another env config."""
    from lerobot.training.checkpoint import load_config

    # A plain (unstructured) copy, so that a whole env section can be swapped in before re-validation.
    cfg = OmegaConf.create(OmegaConf.to_container(load_config(ckpt_dir)))
    dotted = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key == "policy":
            raise ConfigError(
                "policy= cannot be overridden when evaluating a checkpoint (the checkpoint fixes the policy)"
            )
        if key == "env":
            path = CONFIG_DIR / "env" / f"{value}.yaml"
            if not path.exists():
                options = sorted(p.stem for p in (CONFIG_DIR / "env").glob("*.yaml"))
                raise ConfigError(f"unknown env {value!r}; available env options: {', '.join(options)}")
            cfg.env = OmegaConf.load(path)
        else:
            dotted.append(override)
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotted))
    except Exception as e:
        raise ConfigError(f"bad override: {str(e).splitlines()[0]}") from None
    return validate_config(cfg)


def _check_features(trained: DictConfig, current: DictConfig) -> None:
    """A checkpoint only runs on an env that produces the features it was trained on."""
    want = {k: list(v.shape) for k, v in env_config(trained).features.items()}
    have = {k: list(v.shape) for k, v in env_config(current).features.items()}
    if want != have:
        raise ConfigError(
            f"the checkpoint was trained on env {trained.env.name!r} with features {want}, but env "
            f"{current.env.name!r} provides {have}; evaluate it with env={trained.env.name}"
        )


def _eval(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description="Evaluate a checkpoint or a baseline policy.")
    parser.add_argument("--checkpoint", type=Path, help="checkpoint dir, run dir or checkpoints/ dir")
    parser.add_argument("--output-dir", type=Path, help="where eval_info.json and videos go")
    parser.add_argument("overrides", nargs="*", help="e.g. eval.n_episodes=50 eval.batch_size=10 device=cpu")
    args = parser.parse_args(argv)

    from lerobot.policies.factory import make_policy, make_policy_config
    from lerobot.training.checkpoint import load_config, load_policy, resolve_checkpoint_dir
    from lerobot.training.common import evaluate, resolve_device, set_seed

    if args.checkpoint is not None:
        ckpt = resolve_checkpoint_dir(args.checkpoint)
        cfg = checkpoint_config(ckpt, args.overrides)
        _check_features(load_config(ckpt), cfg)
        device = resolve_device(cfg.device)
        policy, _ = load_policy(ckpt, device=device, cfg=cfg)
    else:
        cfg = compose_config(args.overrides)
        policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
        if policy_cfg.training_mode != "none":
            raise ConfigError(f"policy {policy_cfg.name!r} needs trained weights: pass --checkpoint DIR")
        device = resolve_device(cfg.device)
        policy = make_policy(policy_cfg).to(device)
    set_seed(cfg.seed)
    env_cfg = env_config(cfg)
    out_dir = args.output_dir
    if out_dir is None:
        now = dt.datetime.now()
        out_dir = (
            Path("outputs/eval")
            / now.strftime("%Y-%m-%d")
            / f"{now:%H-%M-%S}_{env_cfg.name}_{cfg.policy.name}"
        )
    info = evaluate(cfg, policy, Path(out_dir), progress=True)
    print(json.dumps(info["aggregated"], indent=2))
    print(f"wrote {Path(out_dir) / 'eval_info.json'} and {len(info['video_paths'])} video(s)")
    return 0


def eval_main(argv: list[str] | None = None) -> int:
    """`scripts/eval.py`: evaluate a checkpoint (or a baseline) and write eval_info.json; returns the exit code."""
    return _run(_eval, argv)
