"""Composing a run config from `configs/` with Hydra's compose API, and the configs evaluation starts from.

Groups `env=` and `policy=`, dotted overrides such as `training.steps=100`; the result is validated and
completed with every default (`lerobot.policy_registry.validate_run_config`). `--config-dir DIR` adds a
directory with the same layout (`DIR/env/<name>.yaml`, `DIR/policy/<name>.yaml`) to the search path, for envs
and policy variants that live outside this repository. The defaults are the dataclasses, given to Hydra as
structured configs (`schema` for the root, one node per registered policy in the `policy` group), so a new
policy needs no YAML.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from lerobot.checkpoints.hub import PretrainedSpec
from lerobot.checkpoints.run import load_config
from lerobot.cli.recipes import EXPERIMENT_GROUP, RecipeChoice, choose_recipe
from lerobot.config import CONFIG_DIR, RootConfig, old_inference_keys_error
from lerobot.errors import ConfigError
from lerobot.policy_registry import (
    available_policies,
    current_policy_name,
    policy_config_class,
    validate_run_config,
)

log = logging.getLogger(__name__)

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
    return validate_run_config(cfg)


def compose_train_config(overrides: list[str], search_path: Sequence[str | Path] = ()) -> DictConfig:
    """`compose_config` for a training run: the recipe `recipe=auto|cpu|paper` picks is composed under the
    overrides (`lerobot.cli.recipes`: on a CPU, the CPU recipe of the policy and env), said in one logged
    line; an unset `output_dir` becomes Hydra's `hydra.run.dir` (`outputs/train/<date>/<time>_<env>_<policy>`
    unless overridden), as Hydra users expect."""
    choice = recipe_choice(overrides, search_path)
    if choice.experiment is not None:
        overrides = [f"+{EXPERIMENT_GROUP}={choice.experiment}", *overrides]
    if choice.line is not None:
        log.info(choice.line)
    cfg, dirs = _compose(overrides, CONFIG_DIR, search_path)
    if cfg.output_dir is None:
        # The default run dir is new at every launch (it holds the time), so it has nothing to resume.
        named = any(o.startswith("hydra.run.dir=") for o in overrides)
        if not named and str(OmegaConf.select(cfg, "training.resume")).lower() == "true":
            raise ConfigError("training.resume=true needs output_dir=<run directory of the run to resume>")
        cfg.output_dir = dirs["run"]
    return validate_run_config(cfg)


def recipe_choice(overrides: Sequence[str], search_path: Sequence[str | Path] = ()) -> RecipeChoice:
    """What `recipe=auto|cpu|paper` picks for a training run composed from `overrides`: the recipe to compose
    under them, if any, and the start-up line (`lerobot.cli.recipes.choose_recipe`)."""
    cfg, dirs = _compose(list(overrides), CONFIG_DIR, search_path)
    return choose_recipe(validate_run_config(cfg), dirs["choices"], [CONFIG_DIR, *map(Path, search_path)])


def sweep_dir(overrides: list[str], search_path: Sequence[str | Path] = ()) -> str:
    """`hydra.sweep.dir` as one job with `overrides` resolves it (`outputs/multirun/<date>/<time>_<env>_<policy>`
    unless overridden): the directory a sweep writes into, named once, before any job runs."""
    return _compose(overrides, CONFIG_DIR, search_path)[1]["sweep"]


def _compose(
    overrides: list[str], config_dir: Path, search_path: Sequence[str | Path]
) -> tuple[DictConfig, dict[str, Any]]:
    """The composed config without Hydra's own node, and the resolved `hydra.run.dir` and `hydra.sweep.dir`
    (keys `run`, `sweep`: they name the env and the policy, which only the whole config knows) and Hydra's
    group choices (key `choices`: `{"env": "pusht", "policy": "diffusion", "experiment": ..., ...}`)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _refuse_old_inference_overrides(overrides)
    dirs = [Path(config_dir), *(Path(d) for d in search_path)]
    _store_schemas(dirs)
    overrides = hydra_overrides(overrides, search_path)
    try:
        with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
            cfg = compose(config_name="default", overrides=overrides, return_hydra_config=True)
            out = {"run": str(cfg.hydra.run.dir), "sweep": str(cfg.hydra.sweep.dir)}
            out["choices"] = dict(cfg.hydra.runtime.choices)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_hydra_message(e, dirs)) from None
    except yaml.YAMLError as e:  # a config file that is not YAML (Hydra passes the parser's error on)
        raise ConfigError(yaml_message(e)) from None
    with open_dict(cfg):
        del cfg["hydra"]
    record_composition(cfg, out["choices"])
    return cfg, out


def record_composition(cfg: DictConfig, choices: Mapping[str, str | None]) -> None:
    """Write into `cfg` what it was composed with, part of the run's record: the recipe asked for (a plain
    value, not the environment default it may come from) and the experiment file of Hydra's group `choices`
    (None when none)."""
    cfg.recipe = str(cfg.recipe)
    cfg.recipe_applied = choices.get(EXPERIMENT_GROUP)


def _refuse_old_inference_overrides(overrides: Sequence[str]) -> None:
    """`policy.inference.<field>=<value>` was the inference settings' key until they left the policy section:
    one line naming today's key (Hydra's own would only say that the policy has no `inference`)."""
    old = {}
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key.startswith("policy.inference."):
            old[key.removeprefix("policy.inference.")] = value
    if old:
        raise old_inference_keys_error(old)


def hydra_overrides(overrides: Sequence[str], search_path: Sequence[str | Path]) -> list[str]:
    """The overrides Hydra composes with: `overrides`, where a renamed policy's former name is its name now
    (`policy=scripted` is `policy=pusht_scripted`) and a policy variant from a config directory is chosen
    with its `policy.*` settings added as well as replaced (`++policy.KEY=...`: a variant's YAML holds only
    the keys it changes, and validation checks every key against the policy's dataclass afterwards), plus
    the search path of `search_path` (checked: each must be a config directory)."""
    check_config_dirs(search_path)
    overrides = [_current_policy_names(o) for o in overrides]
    dirs = [CONFIG_DIR, *(Path(d) for d in search_path)]
    chosen = [o.partition("=")[2] for o in overrides if o.lstrip("+").partition("=")[0] == "policy"]
    names = {name.strip() for value in chosen for name in value.split(",")}
    variant = any(
        name not in available_policies() and any((d / "policy" / f"{name}.yaml").is_file() for d in dirs)
        for name in names
    )
    if variant:
        overrides = [f"++{o}" if o.startswith("policy.") else o for o in overrides]
    return [*overrides, *search_path_override(search_path)]


def _current_policy_names(override: str) -> str:
    """`override` with each policy that `policy=` names (a sweep's comma list too) by its name now
    (`lerobot.policy_registry.current_policy_name`)."""
    key, equals, value = override.partition("=")
    if key.lstrip("+") != "policy" or not equals:
        return override
    return f"{key}={','.join(current_policy_name(name.strip()) for name in value.split(','))}"


def check_config_dirs(search_path: Sequence[str | Path]) -> None:
    """Raise `ConfigError` for a `--config-dir` that is no directory, or one with neither `env/` nor `policy/`
    in it (a typo, or the `env/` folder itself given): it would be ignored without a word."""
    for d in map(Path, search_path):
        if not d.is_dir():
            raise ConfigError(f"--config-dir {d}: no such directory")
        if not any((d / group).is_dir() for group in GROUPS):
            raise ConfigError(
                f"--config-dir {d} holds neither env/ nor policy/: pass the directory above them "
                "(DIR with DIR/env/NAME.yaml, DIR/policy/NAME.yaml)"
            )


def yaml_message(e: yaml.YAMLError) -> str:
    """A YAML syntax error in one line: the file, line and column, and what the parser found there."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    if mark is None:
        return f"a config file is not valid YAML: {problem}"
    return (
        f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML ({problem}); fix the "
        "file's syntax"
    )


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


def checkpoint_config(ckpt_dir: Path, overrides: list[str], search_path: Sequence[Path] = ()) -> DictConfig:
    """The checkpoint's config with evaluation overrides; `env=NAME` swaps in another env config.

    `NAME` is looked up in `configs/env/` and then in the `env/` folder of each `search_path` directory.
    """
    check_config_dirs(search_path)
    # A plain (unstructured) copy, so that a whole env section can be swapped in before re-validation.
    cfg = OmegaConf.create(OmegaConf.to_container(load_config(ckpt_dir)))
    return _with_eval_overrides(cfg, overrides, search_path)


def pretrained_config(
    spec: PretrainedSpec, overrides: list[str], search_path: Sequence[Path] = ()
) -> DictConfig:
    """The run config that evaluates a pretrained directory: its policy section and recorded env (a LeRobot
    checkpoint records none: `env=NAME` is then required), with evaluation overrides."""
    check_config_dirs(search_path)
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
            try:
                cfg.env = OmegaConf.load(path)
            except yaml.YAMLError as e:
                raise ConfigError(yaml_message(e)) from None
        else:
            dotted.append(override)
    try:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotted))
    except Exception as e:
        raise ConfigError(f"bad override: {str(e).splitlines()[0]}") from None
    return validate_run_config(cfg)
