"""`scripts/eval.py`: evaluate a checkpoint (any format `lerobot.checkpoints` reads) or a baseline policy."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

from lerobot import distributed
from lerobot.checkpoints import load_for_run, locate, read_spec
from lerobot.cli.compose import checkpoint_config, compose_config, pretrained_config
from lerobot.cli.exit import run_command
from lerobot.cli.train import add_config_dir_argument
from lerobot.config import env_config
from lerobot.constants import EVAL_INFO_FILE
from lerobot.devices import resolve_device
from lerobot.errors import ConfigError
from lerobot.evaluation import evaluate
from lerobot.policies.factory import make_policy, make_policy_config
from lerobot.seeding import set_seed


def _eval_output_dir(flag: Path | None, overrides: list[str]) -> Path | None:
    """Where an evaluation writes: `--output-dir`, or an `output_dir=` override (the key training takes,
    so a user who types it gets what it says rather than the default directory); not both."""
    given = [Path(o.split("=", 1)[1]) for o in overrides if o.lstrip("+").startswith("output_dir=")]
    if given and flag is not None:
        raise ConfigError(f"both --output-dir {flag} and output_dir={given[-1]} given: pass one")
    return flag if flag is not None else (given[-1] if given else None)


def _eval(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description="Evaluate a checkpoint or a baseline policy.")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="checkpoint dir, run dir, checkpoints/ dir, or a hub-layout dir (save_pretrained, LeRobot's)",
    )
    parser.add_argument("--output-dir", type=Path, help="where eval_info.json and videos go")
    add_config_dir_argument(parser)
    parser.add_argument("overrides", nargs="*", help="e.g. eval.n_episodes=50 eval.batch_size=10 device=cpu")
    args = parser.parse_intermixed_args(argv)
    out_dir = _eval_output_dir(args.output_dir, args.overrides)

    # Under torchrun every process evaluates its share of the episodes (see `evaluate`).
    if args.checkpoint is not None:
        source = locate(args.checkpoint)
        if source.run:
            cfg = checkpoint_config(source.path, args.overrides, search_path=args.config_dir)
        else:  # a hub-layout directory (save_pretrained's or a LeRobot pretrained_model) or repo
            cfg = pretrained_config(read_spec(source.path), args.overrides, search_path=args.config_dir)
        policy = load_for_run(source, cfg)  # checks the env's features before building the device
        device = distributed.init(resolve_device(cfg.device))
        policy = policy.to(device)
    else:
        cfg = compose_config(args.overrides, search_path=args.config_dir)
        policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
        if policy_cfg.training_mode != "none":
            raise ConfigError(f"policy {policy_cfg.name!r} needs trained weights: pass --checkpoint DIR")
        device = distributed.init(resolve_device(cfg.device))
        policy = make_policy(policy_cfg).to(device)
    set_seed(cfg.seed)
    env_cfg = env_config(cfg)
    if out_dir is None:
        now = distributed.on_main(dt.datetime.now)  # one name for all processes
        out_dir = (
            Path("outputs/eval")
            / now.strftime("%Y-%m-%d")
            / f"{now:%H-%M-%S}_{env_cfg.name}_{cfg.policy.name}"
        )
    info = evaluate(cfg, policy, Path(out_dir), progress=True)
    if not distributed.is_main():
        return 0
    print(json.dumps(info["aggregated"], indent=2))
    print(f"wrote {Path(out_dir) / EVAL_INFO_FILE} and {len(info['video_paths'])} video(s)")
    return 0


def eval_main(argv: list[str] | None = None) -> int:
    """`scripts/eval.py`: evaluate a checkpoint (or a baseline) and write eval_info.json; returns the exit code."""
    return run_command(_eval, argv)
