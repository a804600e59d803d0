"""`scripts/eval.py`: evaluate a checkpoint (any format `lerobot.checkpoints` reads) or a baseline policy.

Each evaluation has a directory of its own: an `--output-dir` that already holds one (its `eval_info.json` or
videos) is refused unless `--overwrite` says to replace it, and so is one that another evaluation is writing
right now (it holds a `flock` on the directory until it ends, however it ends); the default directory
(`outputs/eval/<date>/<time>_<env>_<policy>`) gets a `_2`, `_3`... suffix when two start in the same second.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
from collections.abc import Iterator
from pathlib import Path

from omegaconf import DictConfig

from lerobot import distributed
from lerobot.checkpoints import Source, load_for_run, locate, read_spec
from lerobot.cli.catalog import (
    EVAL_SETTINGS,
    HYDRA_HELP,
    add_hydra_flags,
    catalog,
    config_dirs,
    config_yaml,
    info_text,
)
from lerobot.cli.compose import checkpoint_config, compose_config, pretrained_config
from lerobot.cli.exit import log_above_progress_bars, run_command
from lerobot.cli.train import add_config_dir_argument
from lerobot.config import env_config, policy_config
from lerobot.constants import EVAL_INFO_FILE
from lerobot.errors import ConfigError, RunDirError
from lerobot.evaluation import earlier_evaluation, evaluate, per_task_table, remove_evaluation
from lerobot.policy_registry import make_policy
from lerobot.runtime.files import open_dir, try_flock


def _eval_output_dir(flag: Path | None, overrides: list[str]) -> Path | None:
    """Where an evaluation writes: `--output-dir`, or an `output_dir=` override (the key training takes,
    so a user who types it gets what it says rather than the default directory); not both."""
    given = [Path(o.split("=", 1)[1]) for o in overrides if o.lstrip("+").startswith("output_dir=")]
    if given and flag is not None:
        raise ConfigError(f"both --output-dir {flag} and output_dir={given[-1]} given: pass one")
    return flag if flag is not None else (given[-1] if given else None)


def _check_output_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse (`ConfigError`) an output directory that holds an earlier evaluation, unless `overwrite`."""
    found = earlier_evaluation(out_dir)
    if found is not None and not overwrite:
        raise ConfigError(
            f"{out_dir} already holds an evaluation ({found}); pick another --output-dir for this one, or pass "
            "--overwrite to replace it"
        )


@contextlib.contextmanager
def _sole_writer(out_dir: Path) -> Iterator[None]:
    """Hold `out_dir` (made when missing) for this evaluation, or raise `RunDirError` when another one holds it.

    The lock is a `flock` on the directory itself: no file is left behind, and the kernel drops it when this
    process ends, however it ends. A directory made here and left empty (the evaluation failed before it
    wrote anything) is removed again.
    """
    made = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = open_dir(out_dir)
    try:
        if try_flock(fd) is False:
            raise RunDirError(
                f"{out_dir} is being written by another evaluation right now; wait for it to end, or pick "
                "another --output-dir"
            )
        yield
    finally:
        os.close(fd)
        if made:
            with contextlib.suppress(OSError):  # not empty: it holds this evaluation's results
                out_dir.rmdir()


def _default_output_dir(env_name: str, policy_name: str) -> Path:
    """A new directory `outputs/eval/<date>/<time>_<env>_<policy>`, with a `_2`, `_3`... suffix when that one
    exists already; made here, so that two evaluations started in the same second never share one."""
    now = dt.datetime.now()
    base = Path("outputs/eval") / now.strftime("%Y-%m-%d") / f"{now:%H-%M-%S}_{env_name}_{policy_name}"
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}_{n}")


DESCRIPTION = """\
Evaluate a checkpoint (a run, checkpoint or hub-layout directory) or a baseline policy (policy=random,
policy=scripted) over eval.n_episodes episodes; every setting is a Hydra override (KEY=VALUE, env=NAME)."""
EXAMPLES = (
    "python scripts/eval.py --checkpoint outputs/train/<run> eval.n_episodes=500 eval.batch_size=50",
    "python scripts/eval.py policy=random env=pusht eval.n_episodes=10 eval.batch_size=5",
    "python scripts/eval.py --checkpoint outputs/train/<run> --cfg job   # print the config, evaluate nothing",
)


def _eval(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        description=DESCRIPTION,
        epilog=catalog(config_dirs(argv), EVAL_SETTINGS, EXAMPLES, experiments=False),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="checkpoint dir, run dir, checkpoints/ dir, or a hub-layout dir (save_pretrained, LeRobot's)",
    )
    parser.add_argument(
        "--output-dir", type=Path, help="where eval_info.json and videos go (a directory of its own)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the evaluation already in --output-dir (its eval_info.json and videos/)",
    )
    parser.add_argument(
        "--raw-weights",
        action="store_true",
        help="evaluate the optimizer's own weights of a run trained with EMA, not the averaged ones",
    )
    add_config_dir_argument(parser)
    add_hydra_flags(parser)
    parser.add_argument("overrides", nargs="*", help="e.g. eval.n_episodes=50 eval.batch_size=10 device=cpu")
    args = parser.parse_intermixed_args(argv)
    if args.hydra_help:
        print(HYDRA_HELP, end="")
        return 0
    if args.cfg or args.info:  # the config only: no weights are loaded, nothing is written
        cfg, _ = _config(args)
        source = f"checkpoint {args.checkpoint}" if args.checkpoint else "configs/default.yaml + overrides"
        print(config_yaml(cfg) if args.cfg else info_text(cfg, config_dirs(argv), source) + "\n", end="")
        return 0
    out_dir = _eval_output_dir(args.output_dir, args.overrides)
    if out_dir is None or not distributed.is_main():
        return _evaluate(args, out_dir)
    # Before anything is loaded: an evaluation must not replace another silently, finished or running.
    with _sole_writer(out_dir):
        return _evaluate(args, out_dir)


def _config(args: argparse.Namespace) -> tuple[DictConfig, Source | None]:
    """The evaluation's validated config, and the checkpoint its weights come from (None: a baseline)."""
    if args.checkpoint is not None:
        source = locate(args.checkpoint)
        if source.run:
            return checkpoint_config(source.path, args.overrides, search_path=args.config_dir), source
        # A hub-layout directory (save_pretrained's or a LeRobot pretrained_model) or repo.
        return pretrained_config(read_spec(source.path), args.overrides, search_path=args.config_dir), source
    if args.raw_weights:
        raise ConfigError("--raw-weights reads a checkpoint's training state: pass --checkpoint DIR")
    cfg = compose_config(args.overrides, search_path=args.config_dir)
    policy_cfg = policy_config(cfg)
    if policy_cfg.training_mode != "none":
        raise ConfigError(f"policy {policy_cfg.name!r} needs trained weights: pass --checkpoint DIR")
    return cfg, None


def _evaluate(args: argparse.Namespace, out_dir: Path | None) -> int:
    """Evaluate as `args` (parsed) say, into `out_dir` (None: a new default directory)."""
    if out_dir is not None:
        _check_output_dir(out_dir, args.overwrite)

    # Under torchrun every process evaluates its share of the episodes (see `evaluate`).
    cfg, source = _config(args)
    if source is not None:
        # Checks the env's features before building the device.
        policy = load_for_run(source, cfg, args.raw_weights)
        device = distributed.init(distributed.resolve_device(cfg.device))
        policy = policy.to(device)
    else:
        device = distributed.init(distributed.resolve_device(cfg.device))
        policy = make_policy(policy_config(cfg)).to(device)
    distributed.set_seed(cfg.seed)
    env_cfg = env_config(cfg)
    if out_dir is None:  # one name for all processes
        out_dir = distributed.on_main(lambda: _default_output_dir(env_cfg.name, cfg.policy.name))
    elif args.overwrite and distributed.is_main():
        remove_evaluation(out_dir)
    with log_above_progress_bars():  # log lines above the progress bar, not on its line
        info = evaluate(cfg, policy, Path(out_dir), progress=True)
    if not distributed.is_main():
        return 0
    table = per_task_table(info["aggregated"])
    if table is not None:
        print(table)
    print(json.dumps({k: v for k, v in info["aggregated"].items() if k != "per_task"}, indent=2))
    print(f"wrote {Path(out_dir) / EVAL_INFO_FILE} and {len(info['video_paths'])} video(s)")
    if cfg.eval.get("record_dataset") is not None:
        print(f"recorded the episodes as a LeRobotDataset in {cfg.eval.record_dataset}")
    return 0


def eval_main(argv: list[str] | None = None) -> int:
    """`scripts/eval.py`: evaluate a checkpoint (or a baseline) and write eval_info.json; returns the exit code."""
    return run_command(_eval, argv)
