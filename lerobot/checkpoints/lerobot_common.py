"""What every LeRobot (0.4 - 0.6) `pretrained_model` importer shares: features and normalization modes from
its `config.json`, normalization statistics from its processor files, and its weights file; reading the spec
(`lerobot_spec`) and loading the policy (`load_lerobot_policy`) with a policy's own conversions.

LeRobot saves the normalization statistics only in its processor pipelines: `policy_preprocessor.json` names
a `normalizer_processor` step whose state file (`policy_preprocessor_step_<i>_normalizer_processor.safetensors`,
`i` the step's index in the pipeline) holds flat `<feature>.<stat>` tensors, and `policy_postprocessor.json`
an `unnormalizer_processor` for the actions. The policy-specific importers (`lerobot_diffusion`,
`lerobot_act`) map the config fields and the weight names.

Everything that cannot be mapped is a `PretrainedError` of one line naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from lerobot.checkpoints.hub import CONFIG_JSON, MODEL_FILE, PretrainedSpec, load_state_checked, read_json
from lerobot.config import FeatureConfig, PolicyConfig
from lerobot.constants import ACTION_KIND, ENV_STATE, STATE, VISUAL
from lerobot.errors import PretrainedError
from lerobot.normalize import IDENTITY, MEAN_STD, MIN_MAX, Unnormalize
from lerobot.policy_registry import make_policy

# LeRobot's `FeatureType` / `NormalizationMode` names -> this project's feature kinds / modes.
KINDS = {"STATE": STATE, "ENV": ENV_STATE, "VISUAL": VISUAL, "ACTION": ACTION_KIND}
MODES = {"MEAN_STD": MEAN_STD, "MIN_MAX": MIN_MAX, "IDENTITY": IDENTITY}
# State-dict prefixes of this project's normalization modules (filled from the processor files).
NORMALIZATION_PREFIXES = ("normalize_inputs.", "normalize_targets.", "unnormalize_outputs.")
# Runtime and hub settings of every LeRobot policy config that do not change what the loaded model computes.
RUNTIME_FIELDS = (
    "device",
    "use_amp",
    "push_to_hub",
    "repo_id",
    "private",
    "tags",
    "license",
    "pretrained_path",
    "pretrained_revision",
)
# Processor steps that do nothing this project's evaluation does not already do.
_NEUTRAL_STEPS = {"to_batch_processor", "device_processor"}


def refuse(where: Path, field: str, value: Any, why: str) -> PretrainedError:
    """The one-line error of a LeRobot setting that does not map."""
    return PretrainedError(f"{where}: unsupported LeRobot setting {field}={value!r}: {why}")


def check_fields(config: dict[str, Any], known: Iterable[str], required: Iterable[str], where: Path) -> None:
    """Refuse a `config.json` field outside `known` (a newer LeRobot) or a missing `required` one (this
    project's defaults may differ from LeRobot's: a missing field is not guessed)."""
    known = set(known)
    for field in config:
        if field not in known:
            raise refuse(where, field, config[field], "unknown field (a newer LeRobot?); not mapped")
    for field in required:
        if field not in config:
            raise PretrainedError(f"{where}: LeRobot field {field!r} is missing")
    if config.get("use_peft"):
        raise refuse(where, "use_peft", True, "adapter (PEFT) weights are not merged here")


def read_features(config: dict[str, Any], where: Path) -> dict[str, FeatureConfig]:
    """`input_features` and `output_features` of a LeRobot config as this project's features, in order."""
    features = {}
    for group in ("input_features", "output_features"):
        for key, feature in (config.get(group) or {}).items():
            kind = KINDS.get(feature.get("type"))
            if kind is None:
                raise refuse(
                    where, f"{group}.{key}.type", feature.get("type"), f"expected one of {list(KINDS)}"
                )
            features[key] = FeatureConfig(shape=list(feature["shape"]), kind=kind)
    return features


def normalization_mapping(config: dict[str, Any], kinds: set[str], where: Path) -> dict[str, str]:
    """LeRobot's `normalization_mapping` as this project's, for the feature `kinds` present.

    Every kind is set: a kind LeRobot leaves out is not normalized (this project's default would be)."""
    mapping = dict.fromkeys((VISUAL, STATE, ENV_STATE, ACTION_KIND), IDENTITY)
    for lerobot_kind, mode in (config.get("normalization_mapping") or {}).items():
        kind = KINDS.get(lerobot_kind)
        if kind is None or kind not in kinds:
            continue  # a kind without features normalizes nothing
        if mode not in MODES:
            raise refuse(
                where, f"normalization_mapping.{lerobot_kind}", mode, f"supported modes are {list(MODES)}"
            )
        mapping[kind] = MODES[mode]
    return mapping


def read_config_features(
    config: dict[str, Any], known: Iterable[str], copied: Iterable[str], where: Path
) -> dict[str, FeatureConfig]:
    """The features of a LeRobot `config.json` content `config` (`read_features`), once its fields are checked
    (`check_fields`): each field is one the importer copies (all of them required), one it `known`s, or one
    of the runtime fields (`RUNTIME_FIELDS`)."""
    copied = tuple(copied)
    check_fields(config, (*copied, *known, *RUNTIME_FIELDS), copied, where)
    return read_features(config, where)


def policy_section(
    name: str,
    config: dict[str, Any],
    copied: Iterable[str],
    features: dict[str, FeatureConfig],
    where: Path,
    **converted: Any,
) -> dict[str, Any]:
    """This project's `policy` section for its policy `name`: the `copied` fields of LeRobot's `config`, the
    `converted` ones, no pretrained backbone (the ResNet's weights come from the checkpoint: nothing is
    downloaded) and the normalization mapping of the `features`' kinds (`normalization_mapping`)."""
    section: dict[str, Any] = {"name": name, **{field: config[field] for field in copied}, **converted}
    section["pretrained_backbone_weights"] = None
    section["normalization_mapping"] = normalization_mapping(
        config, {f.kind for f in features.values()}, where
    )
    return section


# ------------------------------------------------------------------------------------------------ stats
def _pipeline(directory: Path, name: str) -> tuple[dict[str, Any], Path]:
    """The processor pipeline `name*.json` of `directory` and its path."""
    found = sorted(directory.glob(f"{name}*.json"))
    if len(found) != 1:
        raise PretrainedError(
            f"{directory} must hold one {name}*.json (LeRobot >= 0.4 keeps the normalization statistics in its "
            f"processor files), found {[p.name for p in found]}"
        )
    return read_json(found[0]), found[0]


def _pipeline_stats(
    directory: Path, name: str, step_name: str
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The config of the `step_name` step of processor `name` and its state tensors."""
    pipeline, path = _pipeline(directory, name)
    found = None
    for step in pipeline.get("steps", []):
        registry = step.get("registry_name")
        if registry == step_name:
            found = step
        elif registry == "rename_observations_processor":
            if step.get("config", {}).get("rename_map"):
                raise refuse(path, "rename_map", step["config"]["rename_map"], "keys are not renamed here")
        elif registry not in _NEUTRAL_STEPS:
            raise refuse(path, "steps", registry, "this processor step has no counterpart here")
    if found is None or "state_file" not in found:
        raise PretrainedError(f"{path} has no {step_name} step with a state_file")
    try:
        state = load_file(directory / found["state_file"])
    except Exception as e:  # missing or corrupt file
        raise PretrainedError(f"cannot read {directory / found['state_file']} ({e})") from None
    return found.get("config", {}), state


def _group_stats(flat: dict[str, torch.Tensor], keys: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """Flat `<feature>.<stat>` tensors -> `{feature: {stat: tensor}}` for the feature `keys`."""
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    for name, value in flat.items():
        for key in keys:
            stat = name[len(key) + 1 :]
            if name.startswith(key + ".") and "." not in stat:
                grouped.setdefault(key, {})[stat] = value
    return grouped


def read_stats(
    directory: Path, features: dict[str, FeatureConfig], mapping: dict[str, str]
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, dict[str, torch.Tensor]]]:
    """`(preprocessor stats, postprocessor stats)` as `{feature: {stat: tensor}}`, from the processor files;
    raises when the preprocessor normalizes a feature kind otherwise than `mapping` (from config.json)."""
    pre_config, pre_flat = _pipeline_stats(directory, "policy_preprocessor", "normalizer_processor")
    _, post_flat = _pipeline_stats(directory, "policy_postprocessor", "unnormalizer_processor")
    lerobot_map = {KINDS.get(k): MODES.get(m, m) for k, m in (pre_config.get("norm_map") or {}).items()}
    for kind in {f.kind for f in features.values()}:
        if lerobot_map.get(kind, IDENTITY) != mapping[kind]:
            raise PretrainedError(
                f"{directory}: the preprocessor normalizes {kind} with {lerobot_map.get(kind, IDENTITY)!r} but "
                f"config.json says {mapping[kind]!r}"
            )
    keys = list(features)
    return _group_stats(pre_flat, keys), _group_stats(post_flat, keys)


def make_normalized_policy(directory: Path, policy_cfg: PolicyConfig) -> nn.Module:
    """The policy of `policy_cfg` (untrained weights) normalizing with the statistics of LeRobot's processor
    files in `directory`: the inputs and targets with the preprocessor's, the actions it returns with the
    postprocessor's (as LeRobot does)."""
    features = {**policy_cfg.input_features, **policy_cfg.output_features}
    pre_stats, post_stats = read_stats(directory, features, policy_cfg.normalization_mapping)
    try:
        policy = make_policy(policy_cfg, dataset_stats=pre_stats)
        policy.unnormalize_outputs = Unnormalize(
            policy_cfg.output_features, policy_cfg.normalization_mapping, post_stats
        )
    except (KeyError, ValueError) as e:
        raise PretrainedError(f"{directory}: normalization statistics do not fit: {e}") from None
    return policy


# ------------------------------------------------------------------------------------------------ weights
def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """LeRobot's `model.safetensors`; refused when it holds the normalization buffers of LeRobot < 0.4."""
    try:
        state = load_file(path)
    except Exception as e:  # safetensors raises several types for missing or corrupt files
        raise PretrainedError(f"cannot read {path} ({e})") from None
    if any(k.startswith(("normalize_inputs.", "unnormalize_outputs.")) for k in state):
        raise PretrainedError(
            f"{path} holds normalization buffers: a LeRobot checkpoint older than 0.4; convert it with "
            "LeRobot's migrate_policy_normalization first"
        )
    return state


def with_own_normalization(state: dict[str, torch.Tensor], policy: nn.Module) -> dict[str, torch.Tensor]:
    """`state` (converted LeRobot weights) completed with `policy`'s normalization buffers, which hold the
    processor files' statistics."""
    own = policy.state_dict()
    return {**state, **{k: v for k, v in own.items() if k.startswith(NORMALIZATION_PREFIXES)}}


# ------------------------------------------------------------------------------------------------ loading
def lerobot_spec(
    directory: Path,
    config: dict[str, Any],
    convert_config: Callable[[dict[str, Any], Path], tuple[dict[str, Any], dict[str, FeatureConfig]]],
    source: str,
) -> PretrainedSpec:
    """The spec of a LeRobot `pretrained_model` directory, from its `config.json` content `config`, converted
    into this project's policy section and features by the policy's `convert_config`; `source` names the
    format in the spec."""
    policy, features = convert_config(config, directory / CONFIG_JSON)
    return PretrainedSpec(directory, source, policy, features, None)


def load_lerobot_policy(
    spec: PretrainedSpec,
    policy_cfg: PolicyConfig,
    policy_name: str,
    label: str,
    convert_weights: Callable[[dict[str, torch.Tensor], nn.Module, Path], dict[str, torch.Tensor]]
    | None = None,
) -> nn.Module:
    """This project's policy of `policy_cfg` (converted from the LeRobot config of `spec`, a LeRobot `label`
    checkpoint that this project's policy `policy_name` loads) with the LeRobot weights and normalization
    statistics of its directory.

    `convert_weights(state, policy, weights_path)` maps LeRobot's weights onto the policy's state dict; None
    loads them as they are (the names already match)."""
    directory = spec.path
    if policy_cfg.name != policy_name:
        raise PretrainedError(
            f"{directory} is a LeRobot {label} checkpoint; policy {policy_cfg.name!r} cannot load it"
        )
    policy = make_normalized_policy(directory, policy_cfg)
    weights = directory / MODEL_FILE
    state = read_weights(weights)
    if convert_weights is not None:
        state = convert_weights(state, policy, weights)
    load_state_checked(policy, with_own_normalization(state, policy), weights)
    return policy
