"""ACT: config, shapes, the loss, inputs by kind, training draws, temporal ensembling, the command line and
checkpoints (tiny configs)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from test_dataset import ZARR, write_fake_zarr
from torch import Tensor

from lerobot.checkpoints import from_pretrained, save_pretrained
from lerobot.cli import compose_config, eval_main, train_main
from lerobot.config import FeatureConfig, env_config
from lerobot.constants import ACTION, ACTION_IS_PAD, LOSS_COUNT, OBS_ENV_STATE, OBS_IMAGE, OBS_STATE
from lerobot.errors import ConfigError
from lerobot.policies.act.configuration import ACTConfig
from lerobot.policies.act.modeling import LATENT_NOISE, ACTPolicy
from lerobot.policies.act.transformer import Dropout, MultiheadAttention
from lerobot.policies.images import resize
from lerobot.policy_registry import make_policy_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tiny import TINY_ACT  # noqa: E402

STATE = FeatureConfig(shape=[2], kind="state", low=[0.0, 0.0], high=[512.0, 512.0])
KEYPOINTS = FeatureConfig(shape=[4], kind="env_state", low=[0.0], high=[512.0])
IMAGE = FeatureConfig(shape=[3, 64, 64], kind="visual")  # a 2x2 ResNet feature map
ACTION_FEATURE = FeatureConfig(shape=[2], kind="action", low=[0.0, 0.0], high=[512.0, 512.0])
CHUNK = 6

# The same tiny model on the command line (keypoints env), for a few training steps and an evaluation.
TINY_CLI = [
    "policy=act",
    "env=pusht_keypoints",
    *TINY_ACT,  # chunks of CHUNK actions
    "training.batch_size=4",
    "training.num_workers=0",
    "training.log_freq=1",
    "eval.n_episodes=2",
    "eval.batch_size=2",
    "eval.use_async_envs=false",
    "eval.max_episodes_rendered=0",
    "env.max_episode_steps=8",
]


def act_config(images: bool = False, **overrides) -> ACTConfig:
    """A 16-wide ACT with one layer per stack, chunks of 6, dropout off (exact comparisons); keypoints and the
    state as inputs, or a 64x64 camera and the state."""
    inputs = {OBS_IMAGE: IMAGE} if images else {OBS_ENV_STATE: KEYPOINTS}
    fields = dict(
        input_features={**inputs, OBS_STATE: STATE},
        output_features={ACTION: ACTION_FEATURE},
        chunk_size=CHUNK,
        n_action_steps=CHUNK,
        dim_model=16,
        n_heads=2,
        dim_feedforward=32,
        n_encoder_layers=1,
        n_vae_encoder_layers=1,
        latent_dim=4,
        dropout=0.0,
    )
    return ACTConfig(**{**fields, **overrides})


def stats_for(config: ACTConfig, action_mean: float = 256.0, action_std: float = 100.0) -> dict:
    stats = {}
    for key, feature in config.input_features.items():
        if feature.kind == "visual":
            stats[key] = {"mean": torch.full((3, 1, 1), 0.4), "std": torch.full((3, 1, 1), 0.25)}
        else:
            stats[key] = {"mean": torch.full(feature.shape, 256.0), "std": torch.full(feature.shape, 100.0)}
    stats[ACTION] = {"mean": torch.full([2], action_mean), "std": torch.full([2], action_std)}
    return stats


def make(config: ACTConfig, seed: int = 0, **stats_kwargs) -> ACTPolicy:
    """The policy with weights perturbed away from their initialization (LayerNorms away from 1/0)."""
    torch.manual_seed(seed)
    policy = ACTPolicy(config, stats_for(config, **stats_kwargs))
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return policy


def obs_batch(config: ACTConfig, batch_size: int, seed: int = 0) -> dict[str, Tensor]:
    """Random observations (B, 1, ...) for every input of `config`."""
    g = torch.Generator().manual_seed(seed)
    batch = {}
    for key, feature in config.input_features.items():
        scale = 1.0 if feature.kind == "visual" else 512.0
        batch[key] = torch.rand((batch_size, 1, *feature.shape), generator=g) * scale
    return batch


def train_batch(config: ACTConfig, batch_size: int, seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    batch = obs_batch(config, batch_size, seed)
    batch[ACTION] = torch.rand(batch_size, config.chunk_size, 2, generator=g) * 512
    is_pad = torch.zeros(batch_size, config.chunk_size, dtype=torch.bool)
    is_pad[0, 4:] = True  # one sample ends two steps before its chunk does
    batch[ACTION_IS_PAD] = is_pad
    return batch


# ---------------------------------------------------------------------- configuration
def test_defaults_are_lerobots_and_the_chunk_starts_now():
    config = ACTConfig()
    assert (config.n_obs_steps, config.chunk_size, config.n_action_steps) == (1, 100, 100)
    assert (config.dim_model, config.n_heads, config.dim_feedforward, config.feedforward_activation) == (
        512,
        8,
        3200,
        "relu",
    )
    assert (config.n_encoder_layers, config.n_decoder_layers, config.pre_norm, config.dropout) == (
        4,
        1,
        False,
        0.1,
    )
    assert (config.use_vae, config.latent_dim, config.n_vae_encoder_layers, config.kl_weight) == (
        True,
        32,
        4,
        10.0,
    )
    assert (config.vision_backbone, config.pretrained_backbone_weights) == ("resnet18", None)
    assert config.replace_final_stride_with_dilation is False and config.temporal_ensemble_coeff is None
    assert (config.optimizer_lr, config.optimizer_lr_backbone, config.optimizer_weight_decay) == (
        1e-5,
        1e-5,
        1e-4,
    )
    assert (config.batch_size, config.scheduler_name, config.use_ema, config.training_mode) == (
        8,
        "constant",
        False,
        "offline",
    )
    assert (
        set(config.normalization_mapping.values()) == {"mean_std"} and len(config.normalization_mapping) == 4
    )
    deltas = act_config(images=True).delta_timestamps(10)
    assert deltas[OBS_IMAGE] == deltas[OBS_STATE] == [0.0]
    assert deltas[ACTION] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(n_obs_steps=2), "n_obs_steps=2: act takes one observation step"),
        (dict(n_action_steps=7), "n_action_steps=7 must be <= chunk_size=6"),
        (dict(chunk_size=0, n_action_steps=0), "must be >= 1"),
        (dict(dim_model=18, n_heads=4), "dim_model=18 must be a positive multiple of n_heads=4"),
        (dict(dim_model=18, n_heads=2, images=True), "dim_model=18 must be a multiple of 4 with images"),
        (dict(feedforward_activation="glu"), "feedforward_activation='glu'"),
        (dict(n_decoder_layers=0), "n_decoder_layers=0 must be >= 1"),
        (dict(latent_dim=0), "latent_dim=0 must be >= 1"),
        (dict(n_vae_encoder_layers=0), "n_vae_encoder_layers=0 must be >= 1 with use_vae=true"),
        (dict(dropout=1.0), "dropout=1.0 must be in"),
        (dict(kl_weight=-1.0), "kl_weight=-1.0 must be >= 0"),
        (dict(optimizer_lr_backbone=-1.0), "optimizer_lr_backbone=-1.0"),
        (dict(vision_backbone="vit_b_16"), "vision_backbone='vit_b_16'"),
        (dict(replace_final_stride_with_dilation=True), "needs a bottleneck ResNet"),
        (dict(resize_shape=[0, 24], images=True), "resize_shape=\\[0, 24\\] must be"),
        (dict(temporal_ensemble_coeff=0.01), "temporal_ensemble_coeff=0.01 needs policy.n_action_steps=1"),
        (dict(temporal_ensemble_coeff=-0.1, n_action_steps=1), "temporal_ensemble_coeff=-0.1 must be >= 0"),
        (dict(normalization_mapping={"state": "zscore"}), "normalization_mapping.state='zscore'"),
        (dict(input_features={OBS_STATE: STATE}), "a visual input or an env_state input"),
        (dict(output_features={ACTION: ACTION_FEATURE, "a2": ACTION_FEATURE}), "exactly one action feature"),
        (
            dict(input_features={OBS_ENV_STATE: KEYPOINTS, OBS_STATE: STATE, "observation.s2": STATE}),
            "at most one 'state' input",
        ),
        (
            dict(
                input_features={OBS_IMAGE: IMAGE, "observation.image2": FeatureConfig([3, 32, 32], "visual")}
            ),
            "must have the same shape",
        ),
    ],
)
def test_config_errors_are_one_line(overrides, message):
    images = overrides.pop("images", False)
    with pytest.raises(ConfigError, match=message) as error:
        act_config(images=images, **overrides).validate()
    assert "\n" not in str(error.value)


def test_command_line_builds_act_without_a_yaml_and_checks_it():
    cfg = compose_config(["policy=act", "env=pusht_keypoints"])
    assert (
        cfg.policy.name == "act"
        and cfg.policy.chunk_size == 100
        and cfg.policy.temporal_ensemble_coeff is None
    )
    with pytest.raises(ConfigError, match="n_action_steps=1"):
        compose_config(["policy=act", "env=pusht_keypoints", "policy.temporal_ensemble_coeff=0.01"])
    config = make_policy_config(cfg.policy, env_config(cfg))
    assert (config.state_feature, config.env_state_feature) == ((OBS_STATE, 2), (OBS_ENV_STATE, 16))


def test_cpu_recipe_composes():
    cfg = compose_config(["+experiment=act_pusht_keypoints_cpu"])
    assert cfg.env.name == "pusht_keypoints" and cfg.policy.name == "act"
    assert (cfg.policy.chunk_size, cfg.policy.n_action_steps, cfg.policy.dim_model) == (20, 20, 128)
    assert cfg.training.batch_size == 64 and cfg.training.steps == 60000 and cfg.training.use_amp == "auto"
    assert (cfg.policy.optimizer_lr, cfg.policy.scheduler_name, cfg.policy.use_ema) == (3e-4, "cosine", True)
    config = make_policy_config(cfg.policy, env_config(cfg))
    policy = ACTPolicy(config)
    # Without the CVAE: no VAE encoder, and the latent token is always zero.
    assert not config.use_vae and not hasattr(policy.model, "vae_encoder")
    assert 0.9e6 < sum(p.numel() for p in policy.parameters()) < 1.3e6


def test_image_cpu_recipe_composes_and_resizes_to_four_image_tokens():
    cfg = compose_config(["+experiment=act_pusht_image_cpu"])
    assert cfg.env.name == "pusht" and cfg.policy.name == "act" and cfg.training.use_amp == "auto"
    assert (cfg.policy.chunk_size, cfg.policy.dim_model, list(cfg.policy.resize_shape)) == (20, 128, [48, 48])
    # The trunk learns from scratch, so at the transformer's rate.
    assert cfg.policy.optimizer_lr_backbone == cfg.policy.optimizer_lr == 3e-4
    config = make_policy_config(cfg.policy, env_config(cfg))
    policy = make(config).eval()
    assert 12e6 < sum(p.numel() for p in policy.parameters()) < 14e6
    features = policy.model.backbone(torch.zeros(1, 3, 48, 48))
    assert features.shape[-2:] == (2, 2)  # 4 image tokens
    chunk = policy.predict_action_chunk(obs_batch(config, 2))
    assert chunk.shape == (2, 20, 2) and torch.isfinite(chunk).all()


# ---------------------------------------------------------------------- shapes and inputs
@pytest.mark.parametrize("images", [False, True], ids=["keypoints", "image"])
def test_forward_and_predict_shapes_and_parameter_groups(images):
    config = act_config(images=images, dropout=0.1, optimizer_lr_backbone=3e-6)
    policy = make(config)
    out = policy.train()(train_batch(config, 3))
    assert set(out) == {"loss", "l1_loss", "kld_loss", LOSS_COUNT}
    assert all(v.ndim == 0 for v in out.values()) and torch.isfinite(out["loss"])
    assert out[LOSS_COUNT] == (4 + 2 * CHUNK) * 2
    out["loss"].backward()
    chunk = policy.eval().predict_action_chunk(obs_batch(config, 5))
    assert chunk.shape == (5, CHUNK, 2) and not chunk.requires_grad
    # The camera tokens come from the frozen-BatchNorm ResNet trunk; its weights have their own learning rate.
    groups = policy.optimizer_param_groups()
    names = {id(p): n for n, p in policy.named_parameters()}
    assert len(groups) == (2 if images else 1)
    if images:
        assert groups[1]["lr"] == 3e-6 and all(
            names[id(p)].startswith("model.backbone.") for p in groups[1]["params"]
        )
        assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in policy.model.backbone.modules())
        assert "model.backbone.bn1.running_mean" in policy.state_dict()
    assert not any(names[id(p)].startswith("model.backbone.") for p in groups[0]["params"])
    assert sum(len(g["params"]) for g in groups) == sum(1 for p in policy.parameters() if p.requires_grad)


def test_inputs_are_picked_by_kind():
    """The keypoint model has no trunk and an env_state token; the image model has no env_state token."""
    keypoints, image = make(act_config()), make(act_config(images=True))
    assert not hasattr(keypoints.model, "backbone") and hasattr(
        keypoints.model, "encoder_env_state_input_proj"
    )
    assert hasattr(image.model, "backbone") and not hasattr(image.model, "encoder_env_state_input_proj")
    assert keypoints.model.encoder_1d_feature_pos_embed.num_embeddings == 3  # latent, state, keypoints
    assert image.model.encoder_1d_feature_pos_embed.num_embeddings == 2  # latent, state (+ 2x2 pixels)
    with pytest.raises(KeyError, match="observation.environment_state"):
        keypoints.predict_action_chunk({OBS_STATE: torch.zeros(1, 1, 2)})
    with pytest.raises(ValueError, match="n_obs_steps=1"):
        keypoints.predict_action_chunk({k: v.repeat(1, 2, 1) for k, v in obs_batch(act_config(), 1).items()})


# ---------------------------------------------------------------------- the loss
def test_loss_is_masked_l1_plus_weighted_kl():
    """With the action head and the latent's output layer set to constants, the loss has a closed form."""
    config = act_config(kl_weight=3.0)
    policy = make(config, action_mean=0.0, action_std=1.0).train()  # normalized actions = actions
    c, mu, log_var = torch.tensor([0.5, -0.25]), 0.3, -0.4
    with torch.no_grad():
        policy.model.action_head.weight.zero_()
        policy.model.action_head.bias.copy_(c)
        policy.model.vae_encoder_latent_output_proj.weight.zero_()
        policy.model.vae_encoder_latent_output_proj.bias.copy_(torch.tensor([mu] * 4 + [log_var] * 4))
    batch = train_batch(config, 3)
    batch[ACTION] = torch.randn(3, CHUNK, 2, generator=torch.Generator().manual_seed(5))
    out = policy(batch)

    real = ~batch[ACTION_IS_PAD]
    l1 = (batch[ACTION] - c).abs()[real].mean()
    kl = 4 * -0.5 * (1 + log_var - mu**2 - math.exp(log_var))  # summed over the 4 latent dimensions
    assert out["l1_loss"].item() == pytest.approx(l1.item(), rel=1e-6)
    assert out["kld_loss"].item() == pytest.approx(kl, rel=1e-6)
    assert out["loss"].item() == pytest.approx(l1.item() + 3.0 * kl, rel=1e-6)
    assert out[LOSS_COUNT] == real.sum() * 2


def test_padded_actions_change_nothing():
    """Padded actions are out of the L1 mean and masked out of the VAE encoder's attention."""
    config = act_config()
    policy = make(config).train()
    batch = train_batch(config, 3)
    noise = policy.draw_training_noise(3)
    reference = policy({**batch, **noise})["loss"]
    changed = {**batch, ACTION: batch[ACTION].clone()}
    changed[ACTION][0, 4:] += 300.0
    torch.testing.assert_close(policy({**changed, **noise})["loss"], reference, rtol=0, atol=1e-6)
    changed[ACTION][0, 3] += 300.0  # a real one
    assert policy({**changed, **noise})["loss"] != reference


def test_without_vae_the_latent_is_zero_and_the_loss_l1():
    config = act_config(use_vae=False)
    policy = make(config)
    assert not any(n.startswith("model.vae_encoder") for n, _ in policy.named_parameters())
    assert policy.train().draw_training_noise(4) == {}
    batch = train_batch(config, 3)
    out = policy(batch)
    assert set(out) == {"loss", "l1_loss", LOSS_COUNT} and out["loss"] == out["l1_loss"]
    # Dropout off: training and evaluation compute the same chunk.
    torch.testing.assert_close(policy.eval()(batch)["loss"], out["loss"], rtol=0, atol=0)


def test_eval_mode_uses_the_prior_mean():
    """In eval mode (validation) the VAE encoder is not used: z = 0 and the loss is the L1 term, that of the
    chunk `predict_action_chunk` returns."""
    config = act_config()
    policy = make(config).eval()
    assert policy.draw_training_noise(3) == {}
    batch = train_batch(config, 3)
    out = policy(batch)
    assert "kld_loss" not in out and out["loss"] == out["l1_loss"]
    std = stats_for(config)[ACTION]["std"]
    error = ((policy.predict_action_chunk(batch) - batch[ACTION]) / std).abs()[~batch[ACTION_IS_PAD]].mean()
    assert out["loss"].item() == pytest.approx(error.item(), rel=1e-5)


# ---------------------------------------------------------------------- training draws
def test_latent_noise_comes_from_the_batch_or_is_drawn_as_forward_draws_it():
    config = act_config()
    policy = make(config).train()
    batch = train_batch(config, 4)
    torch.manual_seed(3)
    drawn_by_forward = policy(batch)["loss"]
    torch.manual_seed(3)
    draws = policy.draw_training_noise(4)
    assert set(draws) == {LATENT_NOISE} and draws[LATENT_NOISE].shape == (4, 4)
    assert policy({**batch, **draws})["loss"] == drawn_by_forward
    other = policy({**batch, LATENT_NOISE: torch.randn(4, 4)})["loss"]
    assert other != drawn_by_forward


def test_shards_weighed_by_their_counts_give_the_global_loss_and_gradient():
    """What the trainer does on 2 processes, each with its rows of the draws (dropout off, the same number of
    padded actions in each shard): the weighed shard losses average to the global loss and gradient."""
    config = act_config()
    policy = make(config).train()
    batch = train_batch(config, 8)
    batch[ACTION_IS_PAD][5, 4:] = True  # 2 padded actions in the second shard, as in the first (sample 0)
    batch = {**batch, **policy.draw_training_noise(8)}
    params = [p for p in policy.parameters() if p.requires_grad]
    whole = policy(batch)
    whole_grads = torch.autograd.grad(whole["loss"], params)
    shards = [policy({k: v[i * 4 : (i + 1) * 4] for k, v in batch.items()}) for i in range(2)]
    total = sum(shard[LOSS_COUNT] for shard in shards)
    weighed = [shard["loss"] * shard[LOSS_COUNT] * 2 / total for shard in shards]
    torch.testing.assert_close(sum(weighed) / 2, whole["loss"], rtol=1e-6, atol=0)
    shard_grads = [torch.autograd.grad(loss, params) for loss in weighed]
    for g_whole, g_first, g_second in zip(whole_grads, *shard_grads):
        scale = g_whole.abs().max().clamp_min(1e-12)
        torch.testing.assert_close((g_first + g_second) / 2 / scale, g_whole / scale, rtol=0, atol=1e-5)


def test_overfits_a_few_samples():
    config = act_config(use_vae=True, kl_weight=1.0)
    policy = make(config).train()
    batch = train_batch(config, 4)
    optimizer = torch.optim.AdamW(policy.optimizer_param_groups(), lr=3e-3)
    first = None
    for _ in range(150):
        out = policy(batch)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        first = first if first is not None else out["l1_loss"].item()
    assert out["l1_loss"].item() < 0.25 * first


# ---------------------------------------------------------------------- temporal ensembling
def ensembled_reference(chunks: list[Tensor], starts: list[int], coeff: float) -> Tensor:
    """Actions `(steps, A)` of one env, the obvious way: at step t, the mean of every chunk predicted at steps
    s in [max(start, t - T + 1), t] for step t, the i-th oldest weighted by exp(-coeff * i); `starts[t]` is
    the step of the env's last reset at or before t. `chunks[s]` is `(T, A)`."""
    actions = []
    for t in range(len(chunks)):
        chunk_len = chunks[t].shape[0]
        predictions = [chunks[s][t - s] for s in range(max(starts[t], t - chunk_len + 1), t + 1)]
        weights = torch.exp(-coeff * torch.arange(len(predictions), dtype=torch.float64))
        stacked = torch.stack(predictions).double()
        actions.append((weights[:, None] * stacked).sum(0) / weights.sum())
    return torch.stack(actions)


@pytest.mark.parametrize("coeff", [0.0, 0.01, 0.5])
def test_ensembling_matches_a_straightforward_reference(coeff):
    config = act_config(n_action_steps=1, temporal_ensemble_coeff=coeff)
    policy = make(config).eval()
    n_envs, steps, reset_env, reset_step = 2, 14, 1, 5
    chunks, actions = [], []
    for t in range(steps):
        if t == reset_step:
            policy.reset(env_ids=[reset_env])
        observation = obs_batch(config, n_envs, seed=100 + t)  # (B, 1, ...), as the policy stacks them
        chunks.append(policy.predict_action_chunk(observation))  # (B, T, A), what select_action predicts
        actions.append(policy.select_action({k: v[:, 0] for k, v in observation.items()}))
        assert policy.steps_until_chunk() == 0
    actions = torch.stack(actions)  # (steps, B, A)
    for env in range(n_envs):
        starts = [reset_step if env == reset_env and t >= reset_step else 0 for t in range(steps)]
        want = ensembled_reference([c[env] for c in chunks], starts, coeff)
        torch.testing.assert_close(actions[:, env].double(), want, rtol=1e-6, atol=1e-4)
    # Ensembling is an average, not a copy: the executed action is not the newest chunk's first.
    assert not torch.allclose(actions[-1], chunks[-1][:, 0])


# ---------------------------------------------------------------------- command line and checkpoints
@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> list[str]:
    base = tmp_path_factory.mktemp("data")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    return [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]


def test_train_evaluate_and_load_from_the_run_dir(tmp_path, data_args):
    run = tmp_path / "run"
    args = [
        *TINY_CLI,
        *data_args,
        "training.steps=3",
        "training.save_freq=3",
        "eval.freq=3",
        f"output_dir={run}",
    ]
    assert train_main(args) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3] and {"l1_loss", "kld_loss", "loss"} <= set(train[0])
    assert [r for r in rows if r["split"] == "eval"][0]["env_steps"] == 16

    out = tmp_path / "eval"
    assert eval_main(["--checkpoint", str(run), "eval.n_episodes=2", "--output-dir", str(out)]) == 0
    info = json.loads((out / "eval_info.json").read_text())
    assert [e["n_steps"] for e in info["per_episode"]] == [8, 8]
    assert info["config"]["policy"]["name"] == "act"

    policy = from_pretrained(run)
    assert isinstance(policy, ACTPolicy) and not policy.training and policy.config.chunk_size == CHUNK
    saved = save_pretrained(policy, tmp_path / "model")
    loaded = from_pretrained(saved, policy_class=ACTPolicy)
    own, back = policy.state_dict(), loaded.state_dict()
    assert own.keys() == back.keys() and all(torch.equal(own[k], back[k]) for k in own)
    observation = {
        OBS_STATE: torch.rand(2, 1, 2) * 512,
        OBS_ENV_STATE: torch.rand(2, 1, 16) * 512,
    }
    torch.testing.assert_close(
        loaded.predict_action_chunk(observation), policy.predict_action_chunk(observation)
    )

    # Ensembling is an evaluation-time override of a checkpoint trained without it.
    ensembled = from_pretrained(run, temporal_ensemble_coeff=0.01, n_action_steps=1)
    assert ensembled.temporal_ensemble_coeff == 0.01
    for _ in range(3):
        assert ensembled.select_action({k: v[:, 0] for k, v in observation.items()}).shape == (2, 2)
        assert ensembled.steps_until_chunk() == 0
    out = tmp_path / "eval_ensembled"
    overrides = ["policy.temporal_ensemble_coeff=0.01", "policy.n_action_steps=1"]
    assert (
        eval_main(["--checkpoint", str(run), "eval.n_episodes=2", "--output-dir", str(out), *overrides]) == 0
    )
    info = json.loads((out / "eval_info.json").read_text())
    assert info["config"]["policy"]["temporal_ensemble_coeff"] == 0.01


def test_docs_name_the_command_lines():
    text = (Path(__file__).resolve().parents[1] / "docs" / "act.md").read_text()
    assert "policy=act env=pusht_keypoints" in text and "+experiment=act_pusht_keypoints_cpu" in text
    assert "+experiment=act_pusht_image_cpu" in text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dropout_drops_at_its_rate_and_keeps_the_expectation(dtype):
    """ACT's CPU dropout: each element is dropped with probability p (to 2^-16), kept ones are scaled so the
    mean is kept, the gradient is the same mask, the global torch seed makes it repeat, and eval mode, p = 0
    and non-contiguous inputs behave as `nn.Dropout`."""
    layer = Dropout(0.1).train()
    x = torch.ones(1000, 1003, dtype=dtype, requires_grad=True)  # an odd size: the last 64-bit draw is cut
    torch.manual_seed(0)
    out = layer(x)
    dropped = (out == 0).double().mean().item()
    assert abs(dropped - 0.1) < 0.003  # 1.003M Bernoulli(0.1): the std of the rate is 3e-4
    kept = out[out != 0].float()
    scale = 65536 / (65536 - round(0.1 * 65536))
    assert torch.allclose(kept, torch.full_like(kept, scale), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6)
    out.sum().backward()
    assert torch.equal(x.grad, out.detach())  # d out / d x is the scaled mask, and x is ones
    torch.manual_seed(0)
    assert torch.equal(layer(x.detach()), out.detach())
    assert not torch.equal(layer(x.detach()), out.detach())  # the next draw differs
    assert torch.equal(layer.eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    y = torch.randn(64, 48).t()  # not contiguous: element (i, j) keeps its own mask entry
    layer.train()
    torch.manual_seed(1)
    masked = layer(y)
    torch.manual_seed(1)
    assert torch.equal(masked == 0, layer(y.contiguous()) == 0)


def test_act_uses_the_cpu_dropout_everywhere():
    policy = ACTPolicy(act_config(images=False, dropout=0.1))
    dropouts = [m for m in policy.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(type(m) is Dropout for m in dropouts)
    attentions = [m for m in policy.modules() if isinstance(m, torch.nn.MultiheadAttention)]
    assert attentions and all(type(m) is MultiheadAttention for m in attentions)


def test_resize_shape_is_the_model_on_resized_images():
    """With `resize_shape` the trunk sees the images resized (antialiased bilinear, after normalization,
    with which it commutes): the chunk equals that of the same weights built for images of that size and
    given them resized."""
    resized = act_config(images=True, resize_shape=[32, 32])
    policy = make(resized).eval()
    small = act_config(
        images=True, input_features={OBS_IMAGE: FeatureConfig([3, 32, 32], "visual"), OBS_STATE: STATE}
    )
    reference = ACTPolicy(small, stats_for(small)).eval()
    reference.load_state_dict(policy.state_dict())
    batch = obs_batch(resized, 3)
    shrunk = {**batch, OBS_IMAGE: resize(batch[OBS_IMAGE][:, 0], (32, 32))[:, None]}
    torch.testing.assert_close(policy.predict_action_chunk(batch), reference.predict_action_chunk(shrunk))
    assert not torch.allclose(
        policy.predict_action_chunk(batch), make(act_config(images=True)).eval().predict_action_chunk(batch)
    )


def test_attention_with_cpu_dropout_is_torchs_attention_with_its_mask():
    """In training on the CPU the attention computes torch's function: with a dropout rate below 2^-17 no
    weight is dropped and the output (and key masking) equals `nn.MultiheadAttention`'s to float tolerance;
    at p = 0.5 about half the weights are dropped, repeatably under the global seed, and the parameters
    get gradients."""
    torch.manual_seed(0)
    attention = MultiheadAttention(32, 4, dropout=1e-9, batch_first=True)
    reference = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    reference.load_state_dict(attention.state_dict())
    query, memory = torch.randn(3, 7, 32), torch.randn(3, 5, 32)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[1, 3:] = True
    ours = attention.train()(query, memory, memory, key_padding_mask=padding)[0]
    theirs = reference.eval()(query, memory, memory, key_padding_mask=padding, need_weights=False)[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    attention.dropout = 0.5
    torch.manual_seed(1)
    dropped = attention(query, memory, memory)[0]
    torch.manual_seed(1)
    assert torch.equal(attention(query, memory, memory)[0], dropped)
    assert not torch.allclose(dropped, theirs, atol=1e-3)
    dropped.square().sum().backward()
    assert attention.in_proj_weight.grad.abs().sum() > 0 and attention.out_proj.weight.grad.abs().sum() > 0
    expected = reference(query, memory, memory, need_weights=False)[0]
    assert torch.equal(attention.eval()(query, memory, memory)[0], expected)
