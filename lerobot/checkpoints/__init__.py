"""Every checkpoint format, behind one `load_policy(path)`; `from_pretrained` (the same, with a class check)
and `save_pretrained(policy, directory)` are the user's pair.

- a training run's checkpoints (`run_dir/checkpoints/<step>/`: weights, the whole run config, the training
  state to resume from, checksums): where they live and which is a run's latest (`run_layout`), one written
  atomically (`run_writer`), one verified and read (`run`).
- `hub`: this project's Hugging Face hub layout (`config.json` + `model.safetensors`); every run checkpoint is
  also such a directory.
- `lerobot_diffusion`, `lerobot_act`: LeRobot's Diffusion Policy and ACT `pretrained_model` directories,
  converted at load (what they share: `lerobot_common`).

A format of another project is one module with `read_spec(directory, config) -> PretrainedSpec` and
`load_weights(spec, policy_cfg) -> Policy`, listed in `LEROBOT_FORMATS` under the policy `type` its
`config.json` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from lerobot.checkpoints import hub, lerobot_act, lerobot_diffusion, run
from lerobot.checkpoints.hub import CONFIG_JSON, LEROBOT_MODEL_DIR, PretrainedSpec
from lerobot.checkpoints.hub import save_pretrained as save_pretrained
from lerobot.checkpoints.run_layout import CONFIG_FILE, resolve_checkpoint_dir
from lerobot.config import EnvConfig, PolicyConfig, env_config, policy_config
from lerobot.errors import ConfigError, PretrainedError
from lerobot.policy_registry import make_policy_config, validate_run_config
from lerobot.runtime.checksums import file_sha256, read_checksums

# LeRobot policy `type` -> the module that reads its `pretrained_model` directories.
LEROBOT_FORMATS: dict[str, ModuleType] = {
    lerobot_diffusion.LEROBOT_TYPE: lerobot_diffusion,
    lerobot_act.LEROBOT_TYPE: lerobot_act,
}


@dataclass(frozen=True)
class Source:
    """Where a policy to load lives: a run checkpoint (`run`: its directory holds `config.yaml`) or a
    pretrained directory (this project's hub layout or another project's)."""

    path: Path
    run: bool


def locate(path_or_repo_id: str | Path, revision: str | None = None) -> Source:
    """What `path_or_repo_id` names: a checkpoint directory, a run directory or its `checkpoints/` folder
    (the newest complete checkpoint), a pretrained directory (or one holding `pretrained_model/`), or a hub
    repo id (fetched into the hub cache)."""
    path = Path(path_or_repo_id)
    if not path.exists():
        return Source(hub.resolve_pretrained(path_or_repo_id, revision), run=False)
    if (path / CONFIG_FILE).exists():
        return Source(path, run=True)
    pretrained = hub.pretrained_dir(path)
    if pretrained is not None:
        return Source(pretrained, run=False)
    return Source(resolve_checkpoint_dir(path), run=True)


def read_spec(path: Path | str) -> PretrainedSpec:
    """What a local pretrained directory (this project's layout or a LeRobot one) declares, before any
    weights are read."""
    directory = hub.pretrained_dir(path)
    if directory is None:
        raise PretrainedError(f"{path} holds no {CONFIG_JSON} (nor {LEROBOT_MODEL_DIR}/{CONFIG_JSON})")
    config = hub.read_json(directory / CONFIG_JSON)
    if config.get("format") == hub.FORMAT:
        return hub.read_spec(directory, config)
    if "type" in config:
        reader = LEROBOT_FORMATS.get(config["type"])
        if reader is None:
            raise PretrainedError(
                f"{directory / CONFIG_JSON}: LeRobot policy type {config['type']!r} is not supported; "
                f"only {', '.join(repr(t) for t in sorted(LEROBOT_FORMATS))} checkpoints load here"
            )
        return reader.read_spec(directory, config)
    raise PretrainedError(
        f"{directory / CONFIG_JSON} is neither this project's policy config (no 'format') nor a LeRobot one "
        "(no 'type')"
    )


def spec_policy_config(spec: PretrainedSpec, overrides: dict[str, Any] | None = None) -> PolicyConfig:
    """The validated policy config of `spec` with its recorded features, and `overrides` applied."""
    try:
        return make_policy_config(
            {**spec.policy, **(overrides or {})}, EnvConfig(features=dict(spec.features))
        )
    except ConfigError as e:
        raise PretrainedError(f"{spec.path / CONFIG_JSON}: {e}") from None


def load_weights(spec: PretrainedSpec, policy_cfg: PolicyConfig) -> nn.Module:
    """The policy of `policy_cfg` (on the CPU) with the weights and statistics of the pretrained `spec`."""
    if spec.source == hub.FORMAT:
        return hub.load_weights(spec, policy_cfg)
    (reader,) = [m for m in LEROBOT_FORMATS.values() if spec.source == m.SOURCE]
    return reader.load_weights(spec, policy_cfg)


def load_policy(
    path_or_repo_id: str | Path,
    device: str | torch.device = "cpu",
    revision: str | None = None,
    **overrides: Any,
) -> nn.Module:
    """The policy saved at `path_or_repo_id` (see `locate`), in eval mode on `device`.

    `overrides` are policy config fields (e.g. `n_action_steps=1`), validated like the command line's
    `policy.<field>=` overrides; one that changes the architecture is refused, naming the field.
    """
    source = locate(path_or_repo_id, revision)
    if source.run:
        cfg = run.load_config(source.path)
        if overrides:
            cfg = validate_run_config(OmegaConf.merge(cfg, {"policy": overrides}))
        policy, _ = run.load_run_policy(source.path, cfg=cfg)
    else:
        spec = read_spec(source.path)
        policy = load_weights(spec, spec_policy_config(spec, overrides))
    return policy.to(device).eval()


def from_pretrained(
    path_or_repo_id: str | Path,
    device: str | torch.device = "cpu",
    revision: str | None = None,
    policy_class: type[nn.Module] | None = None,
    **overrides: Any,
) -> nn.Module:
    """`load_policy`, checking the policy is a `policy_class` when one is given (e.g.
    `from_pretrained("user/repo", policy_class=DiffusionPolicy)`)."""
    policy = load_policy(path_or_repo_id, device=device, revision=revision, **overrides)
    if policy_class is not None and not isinstance(policy, policy_class):
        raise PretrainedError(
            f"{path_or_repo_id} holds a {type(policy).__name__}, not a {policy_class.__name__}"
        )
    return policy


def checkpoint_record(source: Source, raw_weights: bool = False) -> dict[str, Any]:
    """Which weights an evaluation of `source` reads, for its log and `eval_info.json`: `path` (the
    checkpoint directory itself, not the `last` link or run directory that named it, which move on while a run
    trains), `step` (the training step it was saved at; None for a pretrained directory), `sha256` (of its
    `model.safetensors`: the one recorded in `checksums.json`, which loading verifies, else computed) and
    `weights`: `ema` (the averaged weights of a run trained with `policy.use_ema=true`), `raw` (the
    optimizer's own weights: `raw_weights`, or a run trained without EMA) or `pretrained` (a pretrained
    directory, which keeps one set of weights)."""
    path = Path(source.path)
    sha256 = (read_checksums(path) or {}).get(hub.MODEL_FILE) if source.run else None
    if sha256 is None and (path / hub.MODEL_FILE).is_file():
        sha256 = file_sha256(path / hub.MODEL_FILE)
    if not source.run:
        weights = "pretrained"
    elif raw_weights or not run.load_config(path).policy.get("use_ema", False):
        weights = "raw"
    else:
        weights = "ema"
    step = int(path.name) if source.run and path.name.isdigit() else None
    return {"path": str(path), "step": step, "sha256": sha256, "weights": weights}


def load_for_run(source: Source, cfg: DictConfig, raw_weights: bool = False) -> nn.Module:
    """The policy of `source` (on the CPU) built for the run config `cfg` (e.g. evaluation overrides, another
    env with the same features), after checking that `cfg`'s env gives the features it was trained with.

    `raw_weights`: a run checkpoint trained with EMA gets the optimizer's own weights instead of the
    averaged ones (`run.raw_weights`)."""
    if source.run:
        run.check_features(source.path, cfg)  # one line naming the feature and both shapes
        policy, _ = run.load_run_policy(source.path, cfg=cfg)
        if raw_weights:
            policy.load_state_dict(run.raw_weights(source.path))
        return policy
    if raw_weights:
        raise PretrainedError(
            f"{source.path} is a pretrained directory, which keeps one set of weights: --raw-weights needs a "
            "run checkpoint trained with policy.use_ema=true"
        )
    spec = read_spec(source.path)
    hub.check_env_features(spec, env_config(cfg))
    policy_cfg = policy_config(cfg)
    # The env's task input that the policy does not take (`check_env_features`) stays out of its inputs.
    policy_cfg.input_features = {k: f for k, f in policy_cfg.input_features.items() if k in spec.features}
    return load_weights(spec, policy_cfg)
