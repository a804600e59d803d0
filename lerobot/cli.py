"""Command-line entry points behind `scripts/train.py` and `scripts/eval.py`.

Configs are composed with Hydra's compose API from `configs/` (groups `env=` and `policy=`, dotted
overrides such as `training.steps=100`), then validated (and completed with every default) against
`lerobot.config`. `--config-dir DIR` adds a directory with the same layout (`DIR/env/<name>.yaml`,
`DIR/policy/<name>.yaml`) to the search path, for envs and policy variants that live outside this
repository. The defaults are the dataclasses, given to Hydra as structured configs (`schema` for the root, one
node per registered policy in the `policy` group), so a new policy needs no YAML.
Expected failures (bad config, missing data or checkpoint, a dead env worker, a diverged loss) print one
line and exit non-zero.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf, open_dict

from lerobot.config import CONFIG_DIR, ConfigError, env_config, validate_config
from lerobot.constants import EVAL_INFO_FILE

if TYPE_CHECKING:
    from lerobot.policies.pretrained import PretrainedSpec

GROUPS = ("env", "policy")


def compose_config(
    overrides: list[str], config_dir: Path = CONFIG_DIR, search_path: Sequence[str | Path] = ()
) -> DictConfig:
    """Compose `default.yaml` of `config_dir` with Hydra overrides, then validate and complete it.

    Args:
        overrides: Hydra overrides, e.g. `["policy=diffusion", "env=pusht", "training.steps=100"]`.
        config_dir: the primary config directory (holds `default.yaml`).
        search_path: more directories searched for `env/<name>.yaml` and `policy/<name>.yaml` (after
            `config_dir`).
    """
    cfg, _ = _compose(overrides, config_dir, search_path)
    return validate_config(cfg)


def compose_train_config(overrides: list[str], search_path: Sequence[str | Path] = ()) -> DictConfig:
    """`compose_config` for a training run: an unset `output_dir` becomes Hydra's `hydra.run.dir`
    (`outputs/train/<date>/<time>_<env>_<policy>` unless overridden), as Hydra users expect."""
    cfg, run_dir = _compose(overrides, CONFIG_DIR, search_path)
    if cfg.output_dir is None:
        # The default run dir is new at every launch (it holds the time), so it has nothing to resume.
        named = any(o.startswith("hydra.run.dir=") for o in overrides)
        if not named and str(OmegaConf.select(cfg, "training.resume")).lower() == "true":
            raise ConfigError("training.resume=true needs output_dir=<run directory of the run to resume>")
        cfg.output_dir = run_dir
    return validate_config(cfg)


def _compose(
    overrides: list[str], config_dir: Path, search_path: Sequence[str | Path]
) -> tuple[DictConfig, str]:
    """The composed config without Hydra's own node, and the resolved `hydra.run.dir`."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    dirs = [Path(config_dir), *(Path(d) for d in search_path)]
    _store_schemas(dirs)
    overrides = [*overrides, *search_path_override(search_path)]
    try:
        with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
            cfg = compose(config_name="default", overrides=overrides, return_hydra_config=True)
            run_dir = str(cfg.hydra.run.dir)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_hydra_message(e, dirs)) from None
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, run_dir


def search_path_override(search_path: Sequence[str | Path]) -> list[str]:
    """The `hydra.searchpath` override that adds `search_path` (empty when there is none)."""
    if not search_path:
        return []
    paths = ", ".join(f"'file://{Path(d).resolve()}'" for d in search_path)
    return [f"hydra.searchpath=[{paths}]"]


def _store_schemas(dirs: list[Path]) -> None:
    """Give Hydra the dataclasses: `schema` (every root default, which `default.yaml` lists first) and,
    in the `policy` group, one node per registered policy (its dataclass, so `policy=<name>` needs no
    YAML and `policy.<field>=...` is typed). A policy YAML in `dirs` is a named variant (`name:` the
    registered policy, plus its overrides) and must not take a registered name: Hydra's store is global to
    the process, so which one won would depend on what was composed before."""
    from hydra.core.config_store import ConfigStore

    from lerobot.config import RootConfig
    from lerobot.policies.factory import available_policies, policy_config_class

    store = ConfigStore.instance()
    store.store(name="schema", node=RootConfig)
    for name in available_policies():
        for d in dirs:
            if (d / "policy" / f"{name}.yaml").is_file():
                raise ConfigError(
                    f"{d / 'policy' / f'{name}.yaml'} takes the name of the registered policy {name!r}; "
                    f"name the variant differently (e.g. {name}_small.yaml holding `name: {name}` and its overrides)"
                )
        store.store(group="policy", name=name, node=policy_config_class(name))


def group_options(group: str, dirs: Sequence[Path] = (CONFIG_DIR,)) -> list[str]:
    """The names `group=<name>` accepts: YAML files in `dirs` (and, for `policy`, registered policies)."""
    names = {p.stem for d in dirs for p in (Path(d) / group).glob("*.yaml")}
    if group == "policy":
        from lerobot.policies.factory import available_policies

        names.update(available_policies())
    return sorted(names)


def _hydra_message(e: Exception, dirs: Sequence[Path]) -> str:
    text = str(e).strip().splitlines()[0]
    if e.__cause__ is not None and str(e.__cause__).strip():
        # Hydra's own line says which override failed; the cause says why (e.g. the key does not exist).
        text = f"{text.rstrip('.')}: {str(e.__cause__).strip().splitlines()[0]}"
    if "Could not find" in text or "not found" in text.lower():
        for group in GROUPS:
            if f"'{group}/" in text:
                return f"{text}; available {group} options: {', '.join(group_options(group, dirs))}"
    return text


def _expected_errors() -> tuple[type[BaseException], ...]:
    from lerobot.envs.faults import EnvWorkerError
    from lerobot.policies.pretrained import PretrainedError
    from lerobot.rollout import NonFiniteActionError
    from lerobot.training.checkpoint import CheckpointError
    from lerobot.training.common import TrainingDivergedError
    from lerobot.training.run_dir import RunDirError

    errors: list[type[BaseException]] = [
        ConfigError,
        PretrainedError,
        CheckpointError,
        RunDirError,
        EnvWorkerError,
        NonFiniteActionError,
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
    from lerobot.training import distributed

    # On N processes (torchrun) the main one reports progress; the others only warnings and errors.
    logging.basicConfig(
        level=logging.INFO if distributed.is_main() else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    from lerobot.training.stop import EXIT_CODES, StopAborted

    try:
        return main(argv)
    except _expected_errors() as e:
        if distributed.is_main():
            print(f"error: {e}", file=sys.stderr)
        return 2
    except StopAborted as e:
        print(
            f"stopped by {e} without saving (a later relaunch resumes from checkpoints/last)", file=sys.stderr
        )
        return EXIT_CODES[e.signum]
    except KeyboardInterrupt:
        # Outside training (evaluation, conversion): nothing to save; the env workers are already gone.
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_CODES[signal.SIGINT]
    except Exception as e:
        from lerobot.training.checkpoint import no_space_error

        full = no_space_error(e)
        if full is None:
            raise
        # A full disk (or file size limit) anywhere else than in a checkpoint save, which says more itself.
        print(
            f"error: {full.strerror} writing {full.filename or 'a file'}: free space and run again",
            file=sys.stderr,
        )
        return 2
    finally:
        distributed.shutdown()


# ----------------------------------------------------------------------------------------------- train
def _train(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        description="Train a policy.", epilog="example: policy=diffusion env=pusht training.steps=1000"
    )
    _add_config_dir_argument(parser)
    parser.add_argument(
        "-m",
        "--multirun",
        action="store_true",
        help="Hydra multirun: one job per combination of comma-separated values (seed=1,2,3), "
        "launched by hydra/launcher (basic, submitit_local, submitit_slurm)",
    )
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. policy=diffusion env=pusht training.steps=100"
    )
    args = parser.parse_intermixed_args(argv)
    if args.multirun:
        from lerobot.sweep import run_sweep
        from lerobot.training import distributed

        if distributed.world_size() > 1:
            raise ConfigError("a sweep (-m) launches its own jobs, one process each; run it without torchrun")

        return run_sweep(args.overrides, search_path=args.config_dir)
    cfg = compose_train_config(args.overrides, search_path=args.config_dir)
    from lerobot.training import distributed, train
    from lerobot.training.checkpoint import latest_checkpoint
    from lerobot.training.stop import EXIT_CODES, stop_on_signals

    with stop_on_signals() as stop:
        run_dir = train(cfg)
    if stop.stopped_at is not None:
        if distributed.is_main():
            print(
                f"stopped by {stop.name} at step {stop.stopped_at}, checkpoint {latest_checkpoint(run_dir)}; "
                "run the same command again to resume",
                file=sys.stderr,
            )
        return EXIT_CODES[stop.signum]
    if distributed.is_main():
        print(f"run directory: {run_dir}")
    return 0


def _add_config_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config-dir",
        type=Path,
        action="append",
        default=[],
        help="extra config directory with env/ and policy/ YAML files (repeatable)",
    )


def train_main(argv: list[str] | None = None) -> int:
    """`scripts/train.py`: compose the config and train; returns the exit code."""
    return _run(_train, argv)


# ------------------------------------------------------------------------------------------------ eval
def checkpoint_config(ckpt_dir: Path, overrides: list[str], search_path: Sequence[Path] = ()) -> DictConfig:
    """The checkpoint's config with evaluation overrides; `env=NAME` swaps in another env config.

    `NAME` is looked up in `configs/env/` and then in the `env/` folder of each `search_path` directory.
    """
    from lerobot.training.checkpoint import load_config

    # A plain (unstructured) copy, so that a whole env section can be swapped in before re-validation.
    cfg = OmegaConf.create(OmegaConf.to_container(load_config(ckpt_dir)))
    return _with_eval_overrides(cfg, overrides, search_path)


def pretrained_config(
    spec: PretrainedSpec, overrides: list[str], search_path: Sequence[Path] = ()
) -> DictConfig:
    """The run config that evaluates a pretrained directory: its policy section and recorded env (a LeRobot
    checkpoint records none: `env=NAME` is then required), with evaluation overrides."""
    if spec.env is None and not any(o.partition("=")[0] == "env" for o in overrides):
        options = ", ".join(group_options("env", [CONFIG_DIR, *search_path]))
        raise ConfigError(f"{spec.path} records no env: pass env=NAME (available env options: {options})")
    cfg = OmegaConf.create({"policy": spec.policy, **({"env": spec.env} if spec.env else {})})
    return _with_eval_overrides(cfg, overrides, search_path)


def _with_eval_overrides(cfg: DictConfig, overrides: list[str], search_path: Sequence[Path]) -> DictConfig:
    """`cfg` with `env=NAME` (a whole env config swapped in) and dotted overrides applied, validated."""
    dotted = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key == "policy":
            raise ConfigError(
                "policy= cannot be overridden when evaluating a checkpoint (the checkpoint fixes the policy)"
            )
        if key == "env":
            dirs = [CONFIG_DIR, *search_path]
            paths = [Path(d) / "env" / f"{value}.yaml" for d in dirs]
            path = next((p for p in paths if p.is_file()), None)
            if path is None:
                options = ", ".join(group_options("env", dirs))
                raise ConfigError(f"unknown env {value!r}; available env options: {options}")
            cfg.env = OmegaConf.load(path)
        else:
            dotted.append(override)
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotted))
    except Exception as e:
        raise ConfigError(f"bad override: {str(e).splitlines()[0]}") from None
    return validate_config(cfg)


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
    _add_config_dir_argument(parser)
    parser.add_argument("overrides", nargs="*", help="e.g. eval.n_episodes=50 eval.batch_size=10 device=cpu")
    args = parser.parse_intermixed_args(argv)
    out_dir = _eval_output_dir(args.output_dir, args.overrides)

    from lerobot.policies.factory import make_policy, make_policy_config
    from lerobot.policies.pretrained import check_env_features, load_weights, pretrained_dir, read_spec
    from lerobot.training import distributed
    from lerobot.training.checkpoint import CONFIG_FILE, check_features, load_policy, resolve_checkpoint_dir
    from lerobot.training.common import evaluate, resolve_device, set_seed

    # Under torchrun every process evaluates its share of the episodes (see `evaluate`).
    run_checkpoint = args.checkpoint is not None and (args.checkpoint / CONFIG_FILE).exists()
    if args.checkpoint is not None and not run_checkpoint and pretrained_dir(args.checkpoint) is not None:
        # A hub-layout directory (save_pretrained's or a LeRobot pretrained_model), not a run's checkpoint.
        spec = read_spec(args.checkpoint)
        cfg = pretrained_config(spec, args.overrides, search_path=args.config_dir)
        check_env_features(spec, env_config(cfg))
        device = distributed.init(resolve_device(cfg.device))
        policy = load_weights(spec, make_policy_config(cfg.policy, env_config(cfg))).to(device)
    elif args.checkpoint is not None:
        ckpt = resolve_checkpoint_dir(args.checkpoint)
        cfg = checkpoint_config(ckpt, args.overrides, search_path=args.config_dir)
        check_features(ckpt, cfg)  # before building anything: one line naming the feature and both shapes
        device = distributed.init(resolve_device(cfg.device))
        policy, _ = load_policy(ckpt, device=device, cfg=cfg)
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
    return _run(_eval, argv)
