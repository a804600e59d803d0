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
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lerobot import distributed, random_state
from lerobot.checkpoints import Source, checkpoint_record, load_for_run, locate, read_spec
from lerobot.checkpoints.run import load_config
from lerobot.cli.catalog import EVAL_SETTINGS, HYDRA_HELP, command_parser, config_dirs, config_yaml, info_text
from lerobot.cli.compose import checkpoint_config, compose_config, pretrained_config
from lerobot.cli.exit import log_above_progress_bars, run_command
from lerobot.config import env_config, policy_config
from lerobot.constants import EVAL_INFO_FILE
from lerobot.errors import ConfigError, RunDirError
from lerobot.evaluation import (
    check_run_env,
    earlier_evaluation,
    evaluate,
    per_task_table,
    remove_evaluation,
    untrained_tasks,
)
from lerobot.policy_registry import make_policy
from lerobot.runtime.files import open_dir, try_flock

log = logging.getLogger(__name__)


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
policy=pusht_scripted) over eval.n_episodes episodes; every setting is a Hydra override (KEY=VALUE,
env=NAME)."""
EXAMPLES = (
    "python scripts/eval.py --checkpoint outputs/train/<run> eval.n_episodes=500 eval.batch_size=50",
    "python scripts/eval.py policy=random env=pusht eval.n_episodes=10 eval.batch_size=5",
    "python scripts/eval.py --checkpoint outputs/train/<run> --cfg job   # print the config, evaluate nothing",
)


def _eval(argv: list[str] | None) -> int:
    parser = command_parser(DESCRIPTION, argv, EVAL_SETTINGS, EXAMPLES, experiments=False)
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
    parser.add_argument("overrides", nargs="*", help="e.g. eval.n_episodes=50 eval.batch_size=10 device=cpu")
    args = parser.parse_intermixed_args(argv)
    if args.hydra_help:
        print(HYDRA_HELP, end="")
        return 0
    out_dir = _eval_output_dir(args.output_dir, args.overrides)
    if args.cfg or args.info:  # the config only: no weights are loaded, nothing is written
        cfg, _ = _config(args)
        if args.cfg:
            print(config_yaml(cfg), end="")
            return 0
        source = f"checkpoint {args.checkpoint}" if args.checkpoint else "configs/default.yaml + overrides"
        # The config's output_dir is the training run's (a checkpoint's); the evaluation writes elsewhere.
        where = out_dir or f"a new outputs/eval/<date>/<time>_{cfg.env.name}_{cfg.policy.name}"
        print(info_text(cfg, config_dirs(argv), source, f"evaluation results: {where} (--output-dir)"))
        return 0
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


def _untrained_tasks(source: Source, cfg: DictConfig) -> list[str]:
    """The tasks of `env.task` that the checkpoint's policy was not trained on (its run's `env.task`).

    Raises `ConfigError` naming them unless `eval.allow_untrained_tasks=true`, under which they are evaluated
    and labelled (a warning now, `tasks_not_trained_on` in eval_info.json, the console's table)."""
    trained = (load_config(source.path).env if source.run else read_spec(source.path).env or {}).get("task")
    tasks = untrained_tasks(trained, env_config(cfg))
    if not tasks:
        return []
    given = trained if isinstance(trained, str) else f"[{','.join(map(str, trained))}]"
    if not cfg.eval.allow_untrained_tasks:
        raise ConfigError(
            f"checkpoint {source.path} was trained on env.task={given}, not on {', '.join(tasks)}: evaluate the "
            "tasks it was trained on, or pass eval.allow_untrained_tasks=true to evaluate these anyway "
            "(labelled as tasks it was not trained on)"
        )
    log.warning(
        "evaluating on %s, which checkpoint %s was not trained on (env.task=%s; eval.allow_untrained_tasks=true)",
        ", ".join(tasks),
        source.path,
        given,
    )
    return tasks


def _evaluate(args: argparse.Namespace, out_dir: Path | None) -> int:
    """Evaluate as `args` (parsed) say, into `out_dir` (None: a new default directory)."""
    if out_dir is not None:
        _check_output_dir(out_dir, args.overwrite)

    # Under torchrun every process evaluates its share of the episodes (see `evaluate`).
    cfg, source = _config(args)
    untrained = _untrained_tasks(source, cfg) if source is not None else []
    check_run_env(cfg)  # a bad env setting, or a renderer that cannot render, before any weights load
    checkpoint = None
    if source is not None:
        # Checks the env's features before building the device.
        policy = load_for_run(source, cfg, args.raw_weights)
        # Which weights these are, read once loaded (and verified): a run that trains on writes new ones.
        checkpoint = checkpoint_record(source, args.raw_weights)
        log.info("evaluating %s", checkpoint_text(checkpoint))
        device = distributed.init(distributed.resolve_device(cfg.device))
        policy = policy.to(device)
    else:
        device = distributed.init(distributed.resolve_device(cfg.device))
        policy = make_policy(policy_config(cfg)).to(device)
    random_state.set_seed(cfg.seed)
    env_cfg = env_config(cfg)
    if out_dir is None:  # one name for all processes
        out_dir = distributed.on_main(lambda: _default_output_dir(env_cfg.name, cfg.policy.name))
    elif args.overwrite and distributed.is_main():
        remove_evaluation(out_dir)
    with log_above_progress_bars():  # log lines above the progress bar, not on its line
        info = evaluate(
            cfg, policy, Path(out_dir), progress=True, checkpoint=checkpoint, untrained_tasks=untrained
        )
    if not distributed.is_main():
        return 0
    table = per_task_table(info["aggregated"], untrained)
    if table is not None:
        print(table)
    if untrained:
        print(f"not trained on: {', '.join(untrained)} (evaluated with eval.allow_untrained_tasks=true)")
    print(json.dumps({k: v for k, v in info["aggregated"].items() if k != "per_task"}, indent=2))
    if checkpoint is not None:
        print(checkpoint_text(checkpoint))
    print(f"wrote {Path(out_dir) / EVAL_INFO_FILE} and {len(info['video_paths'])} video(s)")
    if cfg.eval.get("record_dataset") is not None:
        print(f"recorded the episodes as a LeRobotDataset in {cfg.eval.record_dataset}")
    return 0


# How `checkpoint_record`'s `weights` reads in the log.
_WEIGHTS_TEXT = {
    "ema": "EMA weights",
    "raw": "raw weights (not EMA)",
    "pretrained": "the pretrained directory's weights",
}


def checkpoint_text(checkpoint: dict[str, Any]) -> str:
    """One line naming the weights evaluated (`lerobot.checkpoints.checkpoint_record`): the checkpoint
    directory, its step, the sha256 of its weights and whether they are the EMA ones."""
    step = f"step {checkpoint['step']}, " if checkpoint["step"] is not None else ""
    sha = f"model.safetensors sha256 {checkpoint['sha256'][:16]}, " if checkpoint["sha256"] else ""
    return f"checkpoint {checkpoint['path']} ({step}{sha}{_WEIGHTS_TEXT[checkpoint['weights']]})"


def eval_main(argv: list[str] | None = None) -> int:
    """`scripts/eval.py`: evaluate a checkpoint (or a baseline) and write eval_info.json; returns the exit code."""
    return run_command(_eval, argv)
