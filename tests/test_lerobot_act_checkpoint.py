"""LeRobot 0.6 ACT checkpoints: loading, equivalence with LeRobot's outputs, refusals, eval.

The fixtures were written by LeRobot 0.6.1 itself (scripts/make_lerobot_fixtures.py, in a separate
environment): `lerobot_act_keypoints` holds a complete `pretrained_model` (state + 16-d environment state, a
32-wide transformer, chunks of 10) plus LeRobot's chunk for fixed observations and the actions its
`select_action` executed over 15 steps of a fixed observation sequence, with plain chunking and with
temporal ensembling (coefficient 0.01); `lerobot_act_image` holds the config and processors of a 96x96
camera model and the names and shapes of its weights (the ResNet-18 alone would be ~45 MB).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lerobot.checkpoints import from_pretrained, load_policy, read_spec, spec_policy_config
from lerobot.checkpoints.hub import MODEL_FILE
from lerobot.cli import eval_main
from lerobot.errors import ConfigError, PretrainedError
from lerobot.policies.act.modeling import ACTPolicy
from lerobot.policies.policy import Policy

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
KEYPOINTS = FIXTURES / "lerobot_act_keypoints"
IMAGE = FIXTURES / "lerobot_act_image"
ENSEMBLING = {"temporal_ensemble_coeff": 0.01, "n_action_steps": 1}  # what the fixture's reference used
# A Python with LeRobot 0.6 installed; when set, full checkpoints are regenerated and compared too.
REFERENCE_PYTHON = os.environ.get("LEROBOT_REFERENCE_PYTHON")
# fp32 tolerances, both relative: to each value, and to the actions' scale (their largest magnitude; actions
# are pixels in [0, 512], where one float32 step is up to 3e-5).
RTOL = 1e-5
SCALE_TOL = 1e-5


def _errors(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    """(max absolute difference, that relative to the largest magnitude of `expected`)."""
    diff = (actual - expected).abs().max().item()
    return diff, diff / expected.abs().max().item()


def _executed(policy: Policy, steps: dict[str, torch.Tensor]) -> torch.Tensor:
    """`(T, B, A)`: the actions `select_action` returns for the observations `steps` `(T, B, ...)`."""
    policy.reset()
    n_steps = next(iter(steps.values())).shape[0]
    return torch.stack([policy.select_action({k: v[t] for k, v in steps.items()}) for t in range(n_steps)])


def _check_against_reference(root: Path) -> dict[str, tuple[float, float]]:
    """Load `root/pretrained_model` and compare with LeRobot's recorded outputs; return the differences."""
    reference = load_file(root / "reference.safetensors")
    raw = {k.removeprefix("raw."): v[:, None] for k, v in reference.items() if k.startswith("raw.")}
    steps = {k.removeprefix("steps."): v for k, v in reference.items() if k.startswith("steps.observation")}
    chunk = from_pretrained(root, policy_class=ACTPolicy).predict_action_chunk(
        raw
    )  # (B, 1, ...): one observation step
    plain = _executed(from_pretrained(root), steps)
    ensembled = _executed(from_pretrained(root, **ENSEMBLING), steps)
    checks = {
        "action_chunk": (chunk, reference["action_chunk"]),
        "steps.actions": (plain, reference["steps.actions"]),
        "steps.actions_ensembled": (ensembled, reference["steps.actions_ensembled"]),
    }
    for name, (actual, expected) in checks.items():
        atol = SCALE_TOL * expected.abs().max().item()
        torch.testing.assert_close(
            actual, expected, rtol=RTOL, atol=atol, msg=lambda message, name=name: f"{name}: {message}"
        )
    return {name: _errors(actual, expected) for name, (actual, expected) in checks.items()}


def test_the_chunk_and_the_executed_actions_are_lerobots():
    """The same chunk for the same observations, and the same actions step by step over 15 steps (a new chunk
    at steps 0 and 10 with plain chunking; one at every step, ensembled, with the coefficient 0.01)."""
    _check_against_reference(KEYPOINTS)


def test_plain_chunking_and_ensembling_differ():
    """The ensembled actions are not the chunked ones (past the first step): the comparison above tests both."""
    reference = load_file(KEYPOINTS / "reference.safetensors")
    plain, ensembled = reference["steps.actions"], reference["steps.actions_ensembled"]
    assert torch.equal(plain[0], ensembled[0])  # the first step executes the first chunk's first action
    assert (plain[1:] - ensembled[1:]).abs().min() > 1e-3


def test_the_config_maps_field_by_field():
    spec = read_spec(KEYPOINTS)
    assert spec.path == KEYPOINTS / "pretrained_model" and spec.env is None
    config = spec_policy_config(spec)
    assert (config.chunk_size, config.n_action_steps, config.n_obs_steps) == (10, 10, 1)
    assert (config.dim_model, config.n_heads, config.dim_feedforward) == (32, 4, 64)
    assert (config.n_encoder_layers, config.n_decoder_layers, config.n_vae_encoder_layers) == (2, 1, 1)
    assert (config.latent_dim, config.use_vae, config.pre_norm, config.dropout) == (8, True, False, 0.1)
    assert config.temporal_ensemble_coeff is None and config.pretrained_backbone_weights is None
    # LeRobot's default mapping has no ENV entry: its environment state is not normalized.
    assert config.normalization_mapping == {
        "visual": "identity",
        "state": "mean_std",
        "env_state": "identity",
        "action": "mean_std",
    }
    assert {k: f.kind for k, f in spec.features.items()} == {
        "observation.state": "state",
        "observation.environment_state": "env_state",
        "action": "action",
    }
    ensembling = spec_policy_config(spec, ENSEMBLING)
    assert (ensembling.temporal_ensemble_coeff, ensembling.n_action_steps) == (0.01, 1)


def test_image_statistics_are_imagenets(tmp_path):
    """LeRobot's training stores ImageNet's mean and std for the cameras by default; they are read back."""
    stats = load_policy(_image_copy(tmp_path)).normalize_inputs.stats["observation_image"]
    assert torch.allclose(stats.mean.flatten(), torch.tensor([0.485, 0.456, 0.406]))
    assert torch.allclose(stats.std.flatten(), torch.tensor([0.229, 0.224, 0.225]))


def _image_copy(base: Path) -> Path:
    """The image fixture in `base/pretrained_model` with weights under LeRobot's names and shapes: this
    project's initialization plus noise (the frozen BatchNorm variances multiplied, so they stay positive).
    Returns that directory."""
    target = base / "pretrained_model"
    shutil.copytree(IMAGE / "pretrained_model", target)
    names = json.loads((IMAGE / "model_names.json").read_text())["names"]
    init = ACTPolicy(spec_policy_config(read_spec(IMAGE))).state_dict()
    gen = torch.Generator().manual_seed(3)
    weights = {}
    for name, shape in names.items():
        noise = 0.05 * torch.randn(shape, generator=gen)
        start = init.get(name, torch.zeros(shape))
        weights[name] = start * noise.exp() if name.endswith("running_var") else start + noise
    save_file(weights, target / MODEL_FILE)
    return target


def test_every_image_model_weight_maps_to_a_parameter_of_the_same_shape(tmp_path):
    """Every weight of LeRobot's image model (ResNet-18 trunk with frozen BatchNorm buffers, transformer,
    VAE encoder, projections) is a tensor of this project's model under the same name and shape, and it
    holds LeRobot's values once loaded; nothing of the model is left out."""
    names = json.loads((IMAGE / "model_names.json").read_text())["names"]
    assert (
        "model.backbone.layer4.1.bn2.running_var" in names
        and "model.encoder_img_feat_input_proj.weight" in names
    )
    policy = ACTPolicy(spec_policy_config(read_spec(IMAGE)))
    own = {k: list(v.shape) for k, v in policy.state_dict().items()}
    model = {k: shape for k, shape in own.items() if not k.startswith(("normalize_", "unnormalize_"))}
    assert model == names

    directory = _image_copy(tmp_path)
    weights = load_file(directory / MODEL_FILE)
    loaded = load_policy(directory).state_dict()
    for name, value in weights.items():
        assert torch.equal(loaded[name], value), name


def test_the_image_checkpoint_evaluates_on_pusht(tmp_path):
    directory = _image_copy(tmp_path / "image")
    out = tmp_path / "eval"
    args = ["--checkpoint", str(directory), "env=pusht", "eval.n_episodes=1", "eval.batch_size=1"]
    args += ["eval.use_async_envs=false", "env.max_episode_steps=4", "eval.max_episodes_rendered=0"]
    assert eval_main([*args, "--output-dir", str(out)]) == 0
    info = json.loads((out / "eval_info.json").read_text())
    assert [e["n_steps"] for e in info["per_episode"]] == [4]


def test_load_time_overrides_are_validated():
    policy = from_pretrained(KEYPOINTS, **ENSEMBLING)
    assert (policy.temporal_ensemble_coeff, policy.n_action_steps) == (0.01, 1)
    with pytest.raises(PretrainedError, match="temporal_ensemble_coeff=0.01") as error:
        from_pretrained(KEYPOINTS, temporal_ensemble_coeff=0.01)
    assert "\n" not in str(error.value)
    with pytest.raises(PretrainedError, match="n_action_steps=11"):
        from_pretrained(KEYPOINTS, n_action_steps=11)
    with pytest.raises(PretrainedError, match="shape mismatch"):  # an override changing the architecture
        from_pretrained(KEYPOINTS, dim_model=64)


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _drop_field(path: Path, field: str) -> None:
    data = json.loads(path.read_text())
    del data[field]
    path.write_text(json.dumps(data))


def _rename_feature(path: Path, group: str, old: str, new: str) -> None:
    data = json.loads(path.read_text())
    data[group] = {new if k == old else k: v for k, v in data[group].items()}
    path.write_text(json.dumps(data))


def _old_normalization_buffers(d: Path) -> None:
    weights = load_file(d / MODEL_FILE)
    weights["normalize_inputs.buffer_observation_state.mean"] = torch.zeros(2)
    save_file(weights, d / MODEL_FILE)


@pytest.mark.parametrize(
    ("fixture", "mutate", "field"),
    [
        (
            IMAGE,
            lambda d: _edit_json(d / "config.json", vision_backbone="efficientnet_b0"),
            "vision_backbone=",
        ),
        (
            KEYPOINTS,
            lambda d: _edit_json(d / "config.json", feedforward_activation="glu"),
            "feedforward_activation=",
        ),
        (
            KEYPOINTS,
            lambda d: _edit_json(d / "config.json", normalization_mapping={"STATE": "QUANTILES"}),
            "STATE",
        ),
        (KEYPOINTS, lambda d: _edit_json(d / "config.json", use_peft=True), "use_peft="),
        (KEYPOINTS, lambda d: _edit_json(d / "config.json", use_lora=True), "use_lora="),
        (KEYPOINTS, lambda d: _drop_field(d / "config.json", "chunk_size"), "'chunk_size' is missing"),
        (KEYPOINTS, lambda d: _edit_json(d / "config.json", n_obs_steps=2), "n_obs_steps=2"),
        (
            KEYPOINTS,
            lambda d: _edit_json(d / "config.json", temporal_ensemble_coeff=0.01),
            "temporal_ensemble_coeff=0.01",
        ),
        (
            KEYPOINTS,
            lambda d: _rename_feature(
                d / "config.json", "input_features", "observation.state", "observation.joints"
            ),
            "input_features.observation.joints=",
        ),
        (
            KEYPOINTS,
            lambda d: _rename_feature(
                d / "config.json", "input_features", "observation.environment_state", "observation.keypoints"
            ),
            "input_features.observation.keypoints=",
        ),
        (
            KEYPOINTS,
            lambda d: _rename_feature(d / "config.json", "output_features", "action", "actions"),
            "output_features.actions=",
        ),
        (
            KEYPOINTS,
            lambda d: _edit_json(d / "config.json", pre_norm=True),
            "model.encoder.norm.bias",
        ),
        (KEYPOINTS, lambda d: (d / "policy_postprocessor.json").unlink(), "policy_postprocessor"),
        (KEYPOINTS, _old_normalization_buffers, "older than 0.4"),
    ],
)
def test_unsupported_lerobot_checkpoints_are_refused_in_one_line(tmp_path, fixture, mutate, field):
    directory = tmp_path / "pretrained_model"
    if fixture == IMAGE:
        directory = _image_copy(tmp_path)
    else:
        shutil.copytree(fixture / "pretrained_model", directory)
    mutate(directory)
    with pytest.raises((PretrainedError, ConfigError)) as error:
        load_policy(directory)
    message = str(error.value)
    assert "\n" not in message and field in message, message


def test_the_backbone_weights_named_in_the_config_are_not_downloaded(tmp_path):
    """LeRobot's default names ImageNet weights; the checkpoint holds the trained ones."""
    directory = _image_copy(tmp_path)
    _edit_json(directory / "config.json", pretrained_backbone_weights="ResNet18_Weights.IMAGENET1K_V1")
    assert load_policy(directory).config.pretrained_backbone_weights is None


def test_eval_script_runs_the_lerobot_act_checkpoint(tmp_path):
    out = tmp_path / "eval"
    cmd = [sys.executable, str(REPO / "scripts" / "eval.py"), "env=pusht_keypoints", "eval.n_episodes=2"]
    cmd += ["--checkpoint", str(KEYPOINTS), "eval.batch_size=2", "eval.use_async_envs=false"]
    cmd += ["env.max_episode_steps=20", "eval.max_episodes_rendered=0", "--output-dir", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    info = json.loads((out / "eval_info.json").read_text())
    assert [e["n_steps"] for e in info["per_episode"]] == [20, 20]
    assert info["config"]["policy"]["name"] == "act" and info["config"]["policy"]["chunk_size"] == 10


def test_eval_with_temporal_ensembling_overrides(tmp_path):
    out = tmp_path / "eval"
    args = ["--checkpoint", str(KEYPOINTS), "env=pusht_keypoints", "eval.n_episodes=2", "eval.batch_size=2"]
    args += ["eval.use_async_envs=false", "env.max_episode_steps=12", "eval.max_episodes_rendered=0"]
    args += ["policy.temporal_ensemble_coeff=0.01", "policy.n_action_steps=1", "--output-dir", str(out)]
    assert eval_main(args) == 0
    info = json.loads((out / "eval_info.json").read_text())
    assert [e["n_steps"] for e in info["per_episode"]] == [12, 12]
    policy = info["config"]["policy"]
    assert (policy["temporal_ensemble_coeff"], policy["n_action_steps"]) == (0.01, 1)


@pytest.mark.skipif(
    not REFERENCE_PYTHON, reason="LEROBOT_REFERENCE_PYTHON (a Python with LeRobot 0.6) not set"
)
@pytest.mark.parametrize(
    ("kind", "settings"),
    [("act_image", []), ("act_keypoints", ["pre_norm=true"]), ("act_keypoints", ["use_vae=false"])],
    ids=["image", "pre_norm", "no_vae"],
)
def test_regenerated_checkpoint_reproduces_lerobot(tmp_path, kind, settings):
    """Regenerates a full checkpoint with LeRobot (the image model with its ResNet-18 weights, or a keypoints
    model with another setting) and compares the chunk and the executed actions."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = REPO / "scripts" / "make_lerobot_fixtures.py"
    cmd = [REFERENCE_PYTHON, str(script), "--kind", kind, "--out", str(tmp_path / kind)]
    for setting in settings:
        cmd += ["--set", setting]
    subprocess.run(cmd, check=True, env=env, cwd=tmp_path, timeout=600)
    _check_against_reference(tmp_path / kind)
