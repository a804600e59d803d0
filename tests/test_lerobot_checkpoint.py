"""LeRobot 0.6 Diffusion Policy checkpoints: loading, equivalence with LeRobot's outputs, refusals, eval.

The fixtures were written by LeRobot 0.6.1 itself (scripts/make_lerobot_fixtures.py, in a separate
environment): `lerobot_diffusion_keypoints` holds a complete `pretrained_model` plus LeRobot's conditioning and
actions for a fixed batch and seed (DDIM, 10 steps; `_ddpm`: the same model with 100 DDPM steps); `lerobot_diffusion_image` holds the config and processors of an image
model and the names and shapes of its weights (the weights themselves would be ~45 MB).
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
from lerobot.checkpoints.lerobot_diffusion import conditioning_order, rename
from lerobot.cli import eval_main
from lerobot.errors import ConfigError, PretrainedError
from lerobot.policies.diffusion.modeling import DiffusionPolicy

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
KEYPOINTS = FIXTURES / "lerobot_diffusion_keypoints"
KEYPOINTS_DDPM = FIXTURES / "lerobot_diffusion_keypoints_ddpm"  # the same model sampled with 100 DDPM steps
IMAGE = FIXTURES / "lerobot_diffusion_image"
IMAGE_KEYPOINTS = FIXTURES / "lerobot_diffusion_image_keypoints"  # images and an environment state
# A Python with LeRobot 0.6 installed; when set, the image fixture is regenerated and compared in full.
REFERENCE_PYTHON = os.environ.get("LEROBOT_REFERENCE_PYTHON")


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max()).item()


def _check_against_reference(root: Path) -> dict[str, float]:
    """Load `root/pretrained_model` and compare with LeRobot's recorded outputs; return the relative errors."""
    reference = load_file(root / "reference.safetensors")
    seed = 1234  # scripts/make_lerobot_fixtures.py's default
    raw = {k.removeprefix("raw."): v for k, v in reference.items() if k.startswith("raw.")}
    policy = from_pretrained(root, policy_class=DiffusionPolicy)
    with torch.no_grad():
        normalized = policy.normalize_inputs(raw)
        global_cond = policy.global_conditioning(normalized)
        noise = torch.randn(reference["initial_noise"].shape, generator=torch.Generator().manual_seed(seed))
        actions = policy.sample_actions(global_cond, generator=torch.Generator().manual_seed(seed))
    chunk = policy.predict_action_chunk(raw, generator=torch.Generator().manual_seed(seed))
    n_action_steps = reference["action_chunk"].shape[1]
    for key in raw:
        assert _relative_error(normalized[key], reference[f"normalized.{key}"]) < 1e-6
    assert torch.equal(noise, reference["initial_noise"])  # the first draw of the generator, as LeRobot's
    expected_cond = reference["global_cond"]
    order = conditioning_order(policy)
    if order is not None:  # LeRobot's per-step order [state, images, env_state], put into this project's
        embed = policy.config.diffusion_step_embed_dim
        expected_cond = expected_cond[:, order[embed:] - embed]
    errors = {
        "global_cond": _relative_error(global_cond, expected_cond),
        "actions_normalized": _relative_error(actions, reference["actions_normalized"]),
        "action_chunk": _relative_error(chunk[:, :n_action_steps], reference["action_chunk"]),
    }
    assert errors["global_cond"] < 1e-5, errors
    assert errors["actions_normalized"] < 1e-4, errors
    assert errors["action_chunk"] < 1e-4, errors
    return errors


@pytest.mark.parametrize("root", [KEYPOINTS, KEYPOINTS_DDPM], ids=["ddim", "ddpm"])
def test_keypoint_checkpoint_reproduces_lerobots_conditioning_and_actions(root):
    """DDIM draws only the initial noise; DDPM draws at every step too, in LeRobot's order."""
    _check_against_reference(root)


def test_the_config_maps_field_by_field():
    spec = read_spec(KEYPOINTS)
    assert spec.path == KEYPOINTS / "pretrained_model" and spec.env is None
    config = spec_policy_config(spec)
    assert (config.horizon, config.n_action_steps, config.n_obs_steps) == (16, 8, 2)
    assert config.down_dims == [16, 32, 64] and config.diffusion_step_embed_dim == 32
    assert (config.noise_scheduler_type, config.inference_scheduler, config.num_inference_steps) == (
        "DDIM",
        "DDIM",
        10,
    )
    assert config.normalization_mapping == {
        "visual": "identity",
        "state": "min_max",
        "env_state": "min_max",
        "action": "min_max",
    }
    assert {k: f.kind for k, f in spec.features.items()} == {
        "observation.state": "state",
        "observation.environment_state": "env_state",
        "action": "action",
    }


def _image_copy(tmp_path: Path, fixture: Path = IMAGE) -> Path:
    """An image fixture with synthetic weights under LeRobot's names and shapes (the spatial softmax grid
    is LeRobot's fixed coordinate grid); returns the pretrained_model directory."""
    target = tmp_path / "image"
    shutil.copytree(fixture / "pretrained_model", target)
    names = json.loads((fixture / "model_names.json").read_text())["names"]
    gen = torch.Generator().manual_seed(3)
    weights = {name: torch.randn(shape, generator=gen) for name, shape in names.items()}
    grid = "diffusion.rgb_encoder.pool.pos_grid"
    height_width = weights[grid].shape[0]
    side = int(height_width**0.5)
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, side), torch.linspace(-1, 1, side), indexing="ij")
    weights[grid] = torch.stack([xs.flatten(), ys.flatten()], dim=-1)
    save_file(weights, target / MODEL_FILE)
    return target


@pytest.mark.parametrize("fixture", [IMAGE, IMAGE_KEYPOINTS], ids=["image", "image_keypoints"])
def test_image_model_weights_land_under_the_mapped_names(tmp_path, fixture):
    """Every weight of LeRobot's image model (ResNet-18 with GroupNorm under BatchNorm names, spatial softmax,
    U-Net) is used once, at the mapped name, with its values; with an environment state too, the FiLM input
    columns follow this project's conditioning order."""
    directory = _image_copy(tmp_path, fixture)
    weights = load_file(directory / MODEL_FILE)
    policy = load_policy(directory)
    own = policy.state_dict()
    mapped = {rename(name): value for name, value in weights.items() if not name.endswith("pos_grid")}
    assert "rgb_encoder.backbone.4.0.bn1.weight" in mapped  # a GroupNorm keeping its BatchNorm name
    assert {k for k in own if not k.startswith(("normalize_", "unnormalize_"))} == set(mapped)
    order = conditioning_order(policy)
    assert (order is None) == (fixture == IMAGE)
    for name, value in mapped.items():
        if order is not None and name.endswith(".film.1.weight"):
            value = value[:, order]
        assert torch.equal(own[name], value.reshape(own[name].shape)), name
    assert isinstance(policy.rgb_encoder.backbone[1], torch.nn.GroupNorm)


def test_a_different_spatial_softmax_grid_is_refused(tmp_path):
    directory = _image_copy(tmp_path)
    weights = load_file(directory / MODEL_FILE)
    weights["diffusion.rgb_encoder.pool.pos_grid"] = -weights["diffusion.rgb_encoder.pool.pos_grid"]
    save_file(weights, directory / MODEL_FILE)
    with pytest.raises(PretrainedError, match="pos_grid differs"):
        load_policy(directory)


def test_a_compiled_unet_checkpoint_loads_the_same(tmp_path):
    """`compile_model: true` saves the U-Net under torch.compile's `_orig_mod` wrapper name."""
    directory = tmp_path / "pretrained_model"
    shutil.copytree(KEYPOINTS / "pretrained_model", directory)
    _edit_json(directory / "config.json", compile_model=True)
    weights = load_file(directory / MODEL_FILE)
    save_file(
        {k.replace("diffusion.unet.", "diffusion.unet._orig_mod."): v for k, v in weights.items()},
        directory / MODEL_FILE,
    )
    raw = {
        k.removeprefix("raw."): v
        for k, v in load_file(KEYPOINTS / "reference.safetensors").items()
        if k.startswith("raw.")
    }
    chunks = [
        load_policy(d).predict_action_chunk(raw, generator=torch.Generator().manual_seed(0))
        for d in (directory, KEYPOINTS)
    ]
    assert torch.equal(*chunks)


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _rename_map(d: Path) -> None:
    pipeline = json.loads((d / "policy_preprocessor.json").read_text())
    pipeline["steps"][0]["config"]["rename_map"] = {"observation.images.top": "observation.image"}
    (d / "policy_preprocessor.json").write_text(json.dumps(pipeline))


def _old_normalization_buffers(d: Path) -> None:
    weights = load_file(d / MODEL_FILE)
    weights["normalize_inputs.buffer_observation_state.min"] = torch.zeros(2)
    save_file(weights, d / MODEL_FILE)


@pytest.mark.parametrize(
    ("fixture", "mutate", "field"),
    [
        (KEYPOINTS, lambda d: _edit_json(d / "config.json", type="vqbet"), "type 'vqbet'"),
        (
            IMAGE,
            lambda d: _edit_json(d / "config.json", vision_backbone="efficientnet_b0"),
            "vision_backbone=",
        ),
        (IMAGE, lambda d: _edit_json(d / "config.json", resize_shape=[32, 32]), "resize_shape="),
        (IMAGE, lambda d: _edit_json(d / "config.json", crop_shape=[33, 33]), "crop_shape="),
        (
            KEYPOINTS,
            lambda d: _edit_json(d / "config.json", noise_scheduler_type="DPMSolver"),
            "noise_scheduler_type",
        ),
        (KEYPOINTS, lambda d: _edit_json(d / "config.json", beta_schedule="sigmoid"), "beta_schedule"),
        (
            KEYPOINTS,
            lambda d: _edit_json(d / "config.json", normalization_mapping={"STATE": "QUANTILES"}),
            "STATE",
        ),
        (KEYPOINTS, lambda d: _edit_json(d / "config.json", use_transformer=True), "use_transformer="),
        (KEYPOINTS, lambda d: _edit_json(d / "config.json", use_peft=True), "use_peft="),
        (KEYPOINTS, _rename_map, "rename_map="),
        (KEYPOINTS, lambda d: (d / "policy_postprocessor.json").unlink(), "policy_postprocessor"),
        (KEYPOINTS, _old_normalization_buffers, "older than 0.4"),
    ],
)
def test_unsupported_lerobot_checkpoints_are_refused_in_one_line(tmp_path, fixture, mutate, field):
    directory = tmp_path / "pretrained_model"
    shutil.copytree(fixture / "pretrained_model", directory)
    mutate(directory)
    with pytest.raises((PretrainedError, ConfigError)) as error:
        load_policy(directory)
    message = str(error.value)
    assert "\n" not in message and field in message, message


def test_eval_script_runs_a_lerobot_checkpoint(tmp_path):
    out = tmp_path / "eval"
    # Overrides on both sides of the flags, as Hydra users type them.
    cmd = [sys.executable, str(REPO / "scripts" / "eval.py"), "env=pusht_keypoints", "eval.n_episodes=2"]
    cmd += ["--checkpoint", str(KEYPOINTS), "eval.batch_size=2", "eval.use_async_envs=false"]
    cmd += ["env.max_episode_steps=20", "eval.max_episodes_rendered=0", "--output-dir", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    info = json.loads((out / "eval_info.json").read_text())
    assert [e["n_steps"] for e in info["per_episode"]] == [20, 20]
    assert info["config"]["policy"]["down_dims"] == [16, 32, 64]


def test_eval_of_a_lerobot_checkpoint_needs_a_fitting_env(capsys):
    assert eval_main(["--checkpoint", str(KEYPOINTS), "eval.n_episodes=1"]) == 2
    assert "records no env: pass env=NAME (available env options: " in capsys.readouterr().err
    assert eval_main(["--checkpoint", str(KEYPOINTS), "env=pusht", "eval.n_episodes=1"]) == 2
    err = capsys.readouterr().err
    assert "expects features" in err and "env 'pusht' provides" in err and err.count("\n") == 1


@pytest.mark.skipif(
    not REFERENCE_PYTHON, reason="LEROBOT_REFERENCE_PYTHON (a Python with LeRobot 0.6) not set"
)
@pytest.mark.parametrize("kind", ["image", "image_keypoints"])
def test_image_checkpoint_reproduces_lerobot(tmp_path, kind):
    """Regenerates a full image checkpoint with LeRobot and compares conditioning and actions."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = REPO / "scripts" / "make_lerobot_fixtures.py"
    subprocess.run(
        [REFERENCE_PYTHON, str(script), "--kind", kind, "--out", str(tmp_path / kind)],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    _check_against_reference(tmp_path / kind)
