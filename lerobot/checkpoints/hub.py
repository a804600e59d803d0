"""Policies in the Hugging Face hub layout: a directory (or hub repo) with `config.json` and `model.safetensors`.

This project's layout:

- `model.safetensors`: the policy's state dict, normalization statistics included (they are buffers).
- `config.json`: `{"format": "lerobot-policy", "format_version": 1, "type": <policy name>, "policy": {every
  field of the policy's config dataclass but the features}, "features": {key: {shape, kind, low, high}},
  "env": <the env config it was trained on, or null>}`. The features fix the model's shapes; the env lets
  `scripts/eval.py --checkpoint DIR` evaluate without naming one.

Every training checkpoint directory holds both files, so it is itself a pretrained directory. A LeRobot
`pretrained_model` directory (its `config.json` has a `type` and no `format`) is read by the importer of its
policy type (`lerobot.checkpoints.lerobot_diffusion`, `lerobot.checkpoints.lerobot_act`).

`load_pretrained` also takes a hub repo id (`user/name`): the repo is fetched with `huggingface_hub` into its
cache, which `HF_HUB_OFFLINE=1` restricts to what is already there.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_save
from torch import nn

from lerobot.config import EnvConfig, FeatureConfig, PolicyConfig
from lerobot.constants import TASK
from lerobot.errors import ConfigError, PretrainedError
from lerobot.policy_registry import make_policy
from lerobot.runtime.files import atomic_write, write_text

CONFIG_JSON = "config.json"
MODEL_FILE = "model.safetensors"
FORMAT = "lerobot-policy"
FORMAT_VERSION = 1
# A LeRobot training run keeps the hub layout of each checkpoint in this subdirectory.
LEROBOT_MODEL_DIR = "pretrained_model"
# What a hub download fetches: configs, weights and (LeRobot) processor states.
_HUB_PATTERNS = ["*.json", "*.safetensors"]


@dataclass(frozen=True)
class PretrainedSpec:
    """What a pretrained directory declares, before any weights are read.

    Attributes:
        path: the directory holding `config.json`.
        source: `"lerobot-policy"` (this project), or the `SOURCE` of the importer of a LeRobot
            `pretrained_model` (`"lerobot-0.6"`: Diffusion Policy, `"lerobot-0.6-act"`: ACT).
        policy: the `policy` config section in this project's terms (`name` first).
        features: every input and output feature the model was built for.
        env: the env config section it was trained on, when recorded (this project's layout only).
    """

    path: Path
    source: str
    policy: dict[str, Any]
    features: dict[str, FeatureConfig]
    env: dict[str, Any] | None


# ------------------------------------------------------------------------------------------------ writing
def features_section(features: Mapping[str, FeatureConfig]) -> dict[str, dict[str, Any]]:
    """`{key: FeatureConfig}` as plain JSON-able dicts."""
    return {key: OmegaConf.to_container(OmegaConf.structured(f)) for key, f in features.items()}


def policy_fields(policy_cfg: PolicyConfig) -> dict[str, Any]:
    """Every field of `policy_cfg` but its features (the env's, recorded beside it), as plain values."""
    section = OmegaConf.to_container(OmegaConf.structured(policy_cfg))
    section.pop("input_features")
    section.pop("output_features")
    return section


def hub_config(policy_cfg: PolicyConfig, env_cfg: EnvConfig | None = None) -> dict[str, Any]:
    """The `config.json` content of a policy with config `policy_cfg` (trained on `env_cfg`, if given)."""
    features = {**policy_cfg.input_features, **policy_cfg.output_features}
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "type": policy_cfg.name,
        "policy": policy_fields(policy_cfg),
        "features": features_section(features),
        "env": None if env_cfg is None else OmegaConf.to_container(OmegaConf.structured(env_cfg)),
    }


def hub_config_text(policy_cfg: PolicyConfig, env_cfg: EnvConfig | None = None) -> str:
    """The text of `config.json` (see `hub_config`)."""
    return json.dumps(hub_config(policy_cfg, env_cfg), indent=2) + "\n"


def write_hub_config(
    save_dir: Path | str, policy_cfg: PolicyConfig, env_cfg: EnvConfig | None = None
) -> Path:
    """Write `config.json` into `save_dir` (atomically); return its path.

    A training checkpoint directory already holds the weights as `model.safetensors`: this file completes
    it into the hub layout.
    """
    return write_text(Path(save_dir) / CONFIG_JSON, hub_config_text(policy_cfg, env_cfg))


def serialize_weights(
    tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> list[bytes | memoryview]:
    """The bytes of a safetensors file holding `tensors` (CPU, contiguous) and header `metadata`, as pieces
    to write in order (`write_weights`); the same bytes for the same content, in any process.

    safetensors lays the tensors out by dtype and name whatever the dict order, but writes the metadata
    in the order of a hash map seeded afresh for every file. The header is therefore written again here,
    with the metadata keys sorted and the tensors in the order of their data (which moves no data).
    """
    raw = safetensors_save(dict(tensors), metadata=dict(metadata) if metadata else None)
    (size,) = struct.unpack("<Q", raw[:8])
    entries = json.loads(raw[8 : 8 + size])
    header = {}
    if "__metadata__" in entries:
        header["__metadata__"] = dict(sorted(entries.pop("__metadata__").items()))
    header.update(sorted(entries.items(), key=lambda item: (item[1]["data_offsets"], item[0])))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors itself pads it
    return [struct.pack("<Q", len(text)) + text, memoryview(raw)[8 + size :]]


def write_weights(path: Path, pieces: list[bytes | memoryview]) -> None:
    """Write the pieces of `serialize_weights` to `path`.

    Through a Python file, not safetensors' own writer, so that the mode follows the umask and a full disk
    raises OSError.
    """
    with open(path, "wb") as f:
        for piece in pieces:
            f.write(piece)


def save_pretrained(policy: nn.Module, save_dir: Path | str, env_cfg: EnvConfig | None = None) -> Path:
    """Write `policy` as `save_dir/{model.safetensors, config.json}` (each file atomically); return `save_dir`."""
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in policy.state_dict().items()}
    weights = serialize_weights(state)
    atomic_write(save_dir / MODEL_FILE, lambda tmp: write_weights(tmp, weights))
    write_hub_config(save_dir, policy.config, env_cfg)
    return save_dir


def push_to_hub(save_dir: Path | str, repo_id: str, private: bool = False, token: str | None = None) -> str:
    """Upload a directory written by `save_pretrained` (or a checkpoint directory) to the hub repo `repo_id`,
    creating it when missing; return the commit URL. Needs network access and a write token."""
    from huggingface_hub import HfApi

    save_dir = Path(save_dir)
    read_spec(save_dir, read_json(save_dir / CONFIG_JSON))  # refuse to upload what would not load back
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    info = api.upload_folder(folder_path=save_dir, repo_id=repo_id, allow_patterns=_HUB_PATTERNS)
    return str(info)


# ------------------------------------------------------------------------------------------------ reading
def is_repo_id(text: str) -> bool:
    """Whether `text` has the shape of a hub repo id (`name` or `namespace/name`) rather than of a path."""
    parts = text.split("/")
    return 1 <= len(parts) <= 2 and all(p and not p.startswith((".", "~")) for p in parts)


def pretrained_dir(path: Path | str) -> Path | None:
    """The directory holding `config.json` for `path` (itself, or its `pretrained_model/`), else None."""
    path = Path(path)
    for candidate in (path, path / LEROBOT_MODEL_DIR):
        if (candidate / CONFIG_JSON).is_file():
            return candidate
    return None


def resolve_pretrained(path_or_repo_id: str | Path, revision: str | None = None) -> Path:
    """A local directory holding `config.json`: `path_or_repo_id` itself, or the hub repo fetched into the
    cache (only what is cached already when `HF_HUB_OFFLINE=1`)."""
    local = Path(path_or_repo_id)
    if local.exists():
        found = pretrained_dir(local)
        if found is None:
            raise PretrainedError(f"{local} holds no {CONFIG_JSON} (nor {LEROBOT_MODEL_DIR}/{CONFIG_JSON})")
        return found
    repo_id = str(path_or_repo_id)
    if not is_repo_id(repo_id):
        raise PretrainedError(f"pretrained policy {repo_id} does not exist (not a directory, not a repo id)")
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=_HUB_PATTERNS))
    except Exception as e:  # offline/not-found/HTTP errors come in several types; all mean "not available"
        if constants.HF_HUB_OFFLINE:
            raise PretrainedError(
                f"policy repo {repo_id!r} is not in the hub cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE "
                f"is set: run `hf download {repo_id}` where the hub is reachable (same HF_HOME), or pass the "
                "local directory holding config.json and model.safetensors"
            ) from None
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PretrainedError(f"cannot fetch policy repo {repo_id!r}: {reason}") from None


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, or a `PretrainedError` naming the file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PretrainedError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise PretrainedError(f"{path} must hold a JSON object")
    return data


def read_spec(directory: Path, config: dict[str, Any]) -> PretrainedSpec:
    """The spec of a directory in this project's layout, from its `config.json` content `config`."""
    if config.get("format_version") != FORMAT_VERSION:
        raise PretrainedError(
            f"{directory / CONFIG_JSON} has format_version {config.get('format_version')!r}; this version "
            f"reads {FORMAT_VERSION}"
        )
    try:
        features = {k: FeatureConfig(**v) for k, v in config["features"].items()}
        policy = dict(config["policy"])
    except (KeyError, TypeError, AttributeError) as e:
        raise PretrainedError(f"{directory / CONFIG_JSON} is incomplete or malformed ({e})") from None
    # Saved before the inference settings left the policy config: they are an evaluation's choice now (the
    # run config's `inference` section), not part of a saved policy.
    policy.pop("inference", None)
    return PretrainedSpec(directory, FORMAT, policy, features, config.get("env"))


def load_state_checked(policy: nn.Module, state: Mapping[str, torch.Tensor], source: Path | str) -> None:
    """`policy.load_state_dict(state)` with a one-line `PretrainedError` naming `source` on any mismatch."""
    own = policy.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        raise PretrainedError(
            f"{source} does not match policy {policy.config.name!r}: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}, shape mismatch {[(k, tuple(state[k].shape)) for k in wrong[:5]]}"
        )
    policy.load_state_dict(state)


def load_weights(spec: PretrainedSpec, policy_cfg: PolicyConfig) -> nn.Module:
    """The policy of `policy_cfg` (on the CPU) with the weights and statistics of `spec`, a directory in this
    project's layout."""
    weights = spec.path / MODEL_FILE
    if not weights.is_file():
        raise PretrainedError(f"{spec.path} is incomplete: {MODEL_FILE} is missing")
    try:
        state = load_file(weights)
    except Exception as e:  # safetensors raises several types for corrupt files
        raise PretrainedError(f"{weights} is corrupt or truncated ({e})") from None
    policy = make_policy(policy_cfg)
    load_state_checked(policy, state, weights)
    return policy


def check_env_features(spec: PretrainedSpec, env_cfg: EnvConfig) -> None:
    """Raise `ConfigError` unless `env_cfg` provides exactly the features (keys, kinds, shapes) of `spec`.

    A task input (`TASK` kind, a multi-task env's task index) that the policy does not take is left out: a
    single-task policy (e.g. one of LeRobot's) runs on such an env and ignores the task."""
    want = {k: (f.kind, list(f.shape)) for k, f in spec.features.items()}
    have = {
        k: (f.kind, list(f.shape))
        for k, f in env_cfg.features.items()
        if k in spec.features or f.kind != TASK
    }
    if want != have:
        raise ConfigError(
            f"the pretrained policy in {spec.path} expects features {want}, but env {env_cfg.name!r} provides "
            f"{have}; pick an env with these features (env=NAME)"
        )
