"""scripts/train.py end to end on a tiny synthetic dataset: checkpoints, eval, exact resume, NaN stop."""

import copy
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from test_dataset import ZARR, write_fake_zarr

from lerobot.cli import eval_main, train_main
from lerobot.errors import CheckpointError, TrainingDivergedError
from lerobot.training.run_dir import RunDir
from lerobot.training.update import TrainStep

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tiny import PUSHT_8PX, TINY_DIFFUSION  # noqa: E402

TINY = [
    "policy=diffusion",
    *TINY_DIFFUSION,
    "policy.num_inference_steps=3",
    "policy.scheduler_warmup_steps=2",
    "training.batch_size=4",
    "training.num_workers=0",
    "training.log_freq=1",
    "eval.n_episodes=2",
    "eval.batch_size=2",
    "eval.use_async_envs=false",
    "eval.max_episodes_rendered=1",
    "env.max_episode_steps=8",
]
TINY_IMAGE = [
    "env=pusht",
    *PUSHT_8PX,
    "policy.crop_shape=[6,6]",
    "policy.spatial_softmax_num_keypoints=4",
]


@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> list[str]:
    base = tmp_path_factory.mktemp("data")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    return [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]


def metrics(run_dir: Path, split: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def test_train_images_then_eval_checkpoint(tmp_path, data_args):
    run = tmp_path / "run"
    args = [
        *TINY,
        *TINY_IMAGE,
        *data_args,
        "training.steps=3",
        "training.save_freq=2",
        "eval.freq=3",
        f"output_dir={run}",
    ]
    assert train_main(args) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["000000002", "000000003", "last"]
    assert (run / "curves.png").stat().st_size > 0
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]
    assert {"loss", "grad_norm", "lr", "data_s", "update_s", "samples_per_s"} <= set(metrics(run)[0])
    assert metrics(run, "eval")[0]["env_steps"] == 16
    assert len(list((run / "eval").rglob("*.mp4"))) == 1
    out = tmp_path / "eval"
    assert eval_main(["--checkpoint", str(run), "eval.n_episodes=2", "--output-dir", str(out)]) == 0
    info = json.loads((out / "eval_info.json").read_text())
    assert [e["n_steps"] for e in info["per_episode"]] == [8, 8]
    # The CPU inference layer is switched on from the command line, for evaluation only.
    fast = tmp_path / "eval_fast"
    overrides = ["inference.fast=true", "inference.dtype=bfloat16"]
    assert (
        eval_main(["--checkpoint", str(run), "eval.n_episodes=2", "--output-dir", str(fast), *overrides]) == 0
    )
    info = json.loads((fast / "eval_info.json").read_text())
    assert info["config"]["inference"]["fast"] is True
    assert [e["n_steps"] for e in info["per_episode"]] == [8, 8]


def test_resume_is_exact(tmp_path, data_args, monkeypatch):
    common = [
        *TINY,
        "device=cpu",  # bit-exact on the CPU; GPU kernels (atomics) need not be deterministic
        "env=pusht_keypoints",
        *data_args,
        "training.steps=6",
        "training.save_freq=3",
        "eval.freq=0",
    ]
    straight = tmp_path / "straight"
    assert train_main([*common, f"output_dir={straight}"]) == 0

    resumed = tmp_path / "resumed"
    real_save = RunDir.save

    def save_then_crash(run_dir, step, *args, **kwargs):
        path = real_save(run_dir, step, *args, **kwargs)
        if step == 3:
            raise KeyboardInterrupt  # the process dies right after the step-3 checkpoint
        return path

    monkeypatch.setattr(RunDir, "save", save_then_crash)
    assert train_main([*common, f"output_dir={resumed}"]) == 130  # the CLI's exit code after an interrupt
    monkeypatch.setattr(RunDir, "save", real_save)
    assert train_main([*common, f"output_dir={resumed}", "training.resume=true"]) == 0

    assert [r["loss"] for r in metrics(resumed)] == [r["loss"] for r in metrics(straight)]
    for name in ("model.safetensors",):
        a = load_file(straight / "checkpoints/000000006" / name)
        b = load_file(resumed / "checkpoints/000000006" / name)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_branch_continues_a_run_exactly_and_rescales_a_changed_learning_rate(tmp_path, data_args):
    common = [*TINY, "device=cpu", "env=pusht_keypoints", *data_args, "training.save_freq=3", "eval.freq=0"]
    straight = tmp_path / "straight"
    assert train_main([*common, "training.steps=6", f"output_dir={straight}"]) == 0
    start = f"training.init_from={straight}/checkpoints/000000003"

    # Unchanged settings: the branch's steps 4-6 are the straight run's.
    same = tmp_path / "same"
    assert train_main([*common, "training.steps=6", start, f"output_dir={same}"]) == 0
    assert [r["step"] for r in metrics(same)] == [4, 5, 6]
    assert [r["loss"] for r in metrics(same)] == [r["loss"] for r in metrics(straight)][3:]

    # Half the learning rate: the schedule goes on where it was, at half the rate.
    half = tmp_path / "half"
    assert (
        train_main([*common, "training.steps=6", "policy.optimizer_lr=5e-5", start, f"output_dir={half}"])
        == 0
    )
    for a, b in zip(metrics(half), metrics(straight)[3:], strict=True):
        assert a["lr"] == pytest.approx(b["lr"] / 2, rel=1e-6)


def test_a_piecewise_constant_schedule_drops_the_rate_at_its_update(tmp_path, data_args):
    run = tmp_path / "run"
    argv = [*TINY, "device=cpu", "env=pusht_keypoints", *data_args, "training.steps=5", "eval.freq=0"]
    argv += ["policy.scheduler_name=piecewise_constant", "policy.scheduler_step_rules='1:3,0.1'"]
    assert train_main([*argv, "policy.scheduler_warmup_steps=0", f"output_dir={run}"]) == 0
    # Updates 1-3 at the full rate; each step logs the rate of the update that comes next.
    assert [r["lr"] for r in metrics(run)] == pytest.approx([1e-4, 1e-4, 1e-5, 1e-5, 1e-5])


def test_nan_loss_stops_with_step_and_keeps_last_checkpoint(tmp_path, data_args, monkeypatch, capsys):
    from lerobot.policies.diffusion.modeling import DiffusionPolicy

    real_forward = DiffusionPolicy.forward
    calls = {"n": 0}

    def nan_on_third(self, batch):
        calls["n"] += 1
        out = real_forward(self, batch)
        if calls["n"] == 3:
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(DiffusionPolicy, "forward", nan_on_third)
    run = tmp_path / "run"
    args = [
        *TINY,
        "env=pusht_keypoints",
        *data_args,
        "training.steps=5",
        "training.save_freq=2",
        "eval.freq=0",
        f"output_dir={run}",
    ]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert "step 3" in err and "nan" in err.lower()
    assert (run / "checkpoints" / "last").resolve().name == "000000002"


def test_online_policy_cannot_train_offline(tmp_path, data_args, capsys):
    args = [
        "policy=tdmpc",
        "env=pusht_keypoints",
        "policy.training_mode=offline",
        *data_args,
        f"output_dir={tmp_path}",
    ]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "learns online" in err and len(err.splitlines()) == 1, err


def tiny_tdmpc(**kw):
    from test_tdmpc import make_policy

    return make_policy(**kw).train()


def tdmpc_batch(batch_size: int = 4, horizon: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "observation.state": torch.rand(batch_size, horizon + 1, 2, generator=g) * 512,
        "observation.environment_state": torch.rand(batch_size, horizon + 1, 4, generator=g) * 512,
        "action": torch.rand(batch_size, horizon, 2, generator=g) * 100 + 100,
        "next.reward": torch.rand(batch_size, horizon, generator=g),
        "next.terminated": torch.zeros(batch_size, horizon),
    }


def test_train_step_uses_the_policys_parameter_groups():
    policy = tiny_tdmpc()
    frozen = list(policy.model.encoder.parameters())
    frozen_ids = {id(p) for p in frozen}
    rest = [p for p in policy.parameters() if p.requires_grad and id(p) not in frozen_ids]
    policy.optimizer_param_groups = lambda: [{"params": frozen, "lr": 0.0}, {"params": rest}]
    update = TrainStep(
        policy,
        policy.config,
        OmegaConf.create({"grad_clip_norm": 10.0, "use_amp": False, "compile": False}),
        10,
    )
    assert [g["lr"] for g in update.optimizer.param_groups] == [0.0, policy.config.optimizer_lr]
    before = [p.detach().clone() for p in policy.parameters()]
    output = update(tdmpc_batch(), where="step 1")
    assert {"loss", "grad_norm"} <= set(output) and not output["loss"].requires_grad
    changed = {id(p) for p, b in zip(policy.parameters(), before) if not torch.equal(p, b)}
    assert not changed & frozen_ids and changed


@pytest.mark.parametrize("limit", [float("inf"), 1e-3])
def test_train_step_reports_the_gradient_norm_before_clipping_and_clips_only_to_a_finite_limit(limit):
    """With no limit (inf) the update computes the norm alone and steps on the gradients as they are; with a
    limit it clips to it. Either way `grad_norm` is the norm before clipping, as torch's clip reports it."""
    settings = OmegaConf.create({"grad_clip_norm": limit, "use_amp": False, "compile": False})
    torch.manual_seed(0)
    policy = tiny_tdmpc()
    update = TrainStep(policy, policy.config, settings, 10)
    update.optimizer.step = lambda: None  # keep the gradients to read them
    output = update(tdmpc_batch(), where="step 1")
    grads = [p.grad.clone() for p in policy.parameters() if p.grad is not None]
    after = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    if math.isinf(limit):
        assert after.item() == pytest.approx(output["grad_norm"].item(), rel=1e-6)
    else:
        assert output["grad_norm"].item() > 1.0 and after.item() == pytest.approx(limit, rel=1e-3)


def test_encoder_lr_scale_gives_the_encoder_its_own_rate_and_a_changed_split_is_refused():
    """TD-MPC2's encoder learning rate: `encoder_lr_scale` != 1 puts the encoder alone in a second group at
    that multiple of `optimizer_lr` (every trainable parameter in exactly one group); 1 keeps one group. A
    checkpoint whose optimizer was split otherwise is refused with one line naming the setting."""
    settings = OmegaConf.create({"grad_clip_norm": 10.0, "use_amp": False, "compile": False})
    policy = tiny_tdmpc(encoder_lr_scale=0.3)
    update = TrainStep(policy, policy.config, settings, 10)
    rest, encoder = update.optimizer.param_groups
    lr = policy.config.optimizer_lr
    assert rest["lr"] == lr and encoder["lr"] == pytest.approx(0.3 * lr)
    assert {id(p) for p in encoder["params"]} == {id(p) for p in policy.model.encoder.parameters()}
    trainable = [id(p) for p in policy.parameters() if p.requires_grad]
    assert sorted(id(p) for g in update.optimizer.param_groups for p in g["params"]) == sorted(trainable)
    update(tdmpc_batch(), where="step 1")
    one_group = tiny_tdmpc()
    assert len(TrainStep(one_group, one_group.config, settings, 10).optimizer.param_groups) == 1
    resumed = TrainStep(one_group, one_group.config, settings, 10)
    with pytest.raises(
        CheckpointError, match=r"2 parameter group\(s\), this config makes 1.*encoder_lr_scale"
    ):
        resumed.load_state_dict(update.state_dict())


def test_train_step_optimizer_is_fused_adamw_with_the_same_math():
    policy = tiny_tdmpc()
    reference = copy.deepcopy(policy)
    update = TrainStep(
        policy,
        policy.config,
        OmegaConf.create({"grad_clip_norm": 10.0, "use_amp": False, "compile": False}),
        10,
    )
    assert update.optimizer.defaults["fused"] is True  # on a CPU, as on CUDA
    plain = torch.optim.AdamW(
        reference.optimizer_param_groups(),
        lr=policy.config.optimizer_lr,
        betas=tuple(policy.config.optimizer_betas),
        eps=policy.config.optimizer_eps,
        weight_decay=policy.config.optimizer_weight_decay,
        foreach=False,
    )
    for _ in range(3):
        for p, q in zip(policy.parameters(), reference.parameters(), strict=True):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        update.optimizer.step()
        plain.step()
    for p, q in zip(policy.parameters(), reference.parameters(), strict=True):
        scale = q.detach().abs().max().clamp_min(policy.config.optimizer_lr)
        assert (p - q).abs().max() <= 1e-5 * scale


def test_lerp_ema_equals_diffusers_ema_and_shares_its_checkpoints():
    from diffusers.training_utils import EMAModel

    from lerobot.training.ema import LerpEMA

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    net[1].bias.requires_grad_(False)  # frozen tensors are copied, as diffusers does
    settings = {"decay": 0.9999, "use_ema_warmup": True, "power": 0.75}
    reference, ema = EMAModel(net.parameters(), **settings), LerpEMA(net.parameters(), **settings)
    for _ in range(20):
        for p in net.parameters():
            p.data.add_(torch.randn_like(p))
        reference.step(net.parameters())
        ema.step(net.parameters())
    assert ema.cur_decay_value == reference.cur_decay_value
    for s, r in zip(ema.shadow_params, reference.shadow_params, strict=True):
        assert (s - r).abs().max() <= 1e-6 * r.abs().max()
    resumed = LerpEMA(net.parameters(), **settings)
    resumed.load_state_dict(reference.state_dict())
    assert resumed.optimization_step == 20
    assert all(torch.equal(s, r) for s, r in zip(resumed.shadow_params, reference.shadow_params, strict=True))


def test_train_step_metrics_name_the_first_update_with_a_non_finite_loss():
    policy = tiny_tdmpc()
    update = TrainStep(
        policy,
        policy.config,
        OmegaConf.create({"grad_clip_norm": 10.0, "use_amp": False, "compile": False}),
        10,
    )
    update(tdmpc_batch(), where="update 6")
    batch = tdmpc_batch()
    batch["next.reward"][0, 0] = float("nan")
    update(batch, where="update 7")  # queued: nothing is read back from the device per update
    update(tdmpc_batch(), where="update 8")
    with pytest.raises(TrainingDivergedError, match="nan at update 7"):
        update.metrics.check_finite()
    with pytest.raises(TrainingDivergedError, match="nan at update 7"):
        update.metrics.pop()


@pytest.mark.parametrize(
    "args,message",
    [
        (["training.bogus=1"], "bogus"),
        (["training.steps=abc"], "training.steps"),
        (["env=pendulum"], "policy"),  # Diffusion Policy needs an image or keypoints input
        (["training.resume=true"], "output_dir"),
    ],
)
def test_config_errors_stop_at_start(args, message, capsys):
    assert train_main(["policy=diffusion", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_compiled_train_step_makes_the_eager_updates(monkeypatch):
    """training.compile: the compiled step gives the eager losses and weights (Diffusion Policy: the trainer
    draws the crops, noise and timesteps before the forward pass; inductor draws any random numbers left
    inside it as eager does)."""
    from test_diffusion import keypoint_config, stats_for, train_batch

    from lerobot.policies.diffusion.modeling import DiffusionPolicy

    monkeypatch.setattr(torch._inductor.config, "fallback_random", True)
    torch._dynamo.reset()
    config = keypoint_config(down_dims=[32])  # one U-Net level: compiling takes most of this test's time
    eager, compiled = (DiffusionPolicy(config, stats_for(config)).train() for _ in range(2))
    compiled.load_state_dict(eager.state_dict())
    start = torch.cat([p.detach().flatten() for p in eager.parameters()])
    steps = [
        TrainStep(p, config, OmegaConf.create({"grad_clip_norm": 10.0, "use_amp": False, "compile": c}), 10)
        for p, c in ((eager, False), (compiled, True))
    ]
    assert steps[1].model is not compiled and steps[0].model is eager
    for i in range(2):
        batch = train_batch(config, batch_size=8, seed=i)
        losses = []
        for step in steps:
            torch.manual_seed(i)
            losses.append(step(batch, where=f"step {i}")["loss"])
        assert torch.isclose(losses[1], losses[0], rtol=1e-4), (i, losses)
    # Compared as a whole: Adam turns a near-zero gradient into a full step of either sign, so a single
    # weight may differ by a step where the two sum in another order; the weights as a whole may not.
    weights = [torch.cat([p.detach().flatten() for p in m.parameters()]) for m in (eager, compiled)]
    assert (weights[1] - weights[0]).norm() <= 1e-2 * (weights[0] - start).norm()
