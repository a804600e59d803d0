"""Device handling without a GPU: device selection, no host sync per training update, tensors that follow
the device of the weights, the CPU pace warning.

Device mixing is caught with `torch.set_default_device("meta")` around CPU weights: a tensor created on the
default device instead of the weights' one lands on `meta`, and an operation mixing it with a CPU tensor
fails (the inverse of the GPU bug, where such a tensor lands on the CPU next to CUDA weights).

Host syncs are counted on the CPU by `HostReads`: every read of a tensor's value by Python (`item`, `bool`,
`float`, `int` are `aten._local_scalar_dense`; `tolist`, `numpy`, `cpu`), which on a GPU waits for the device.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_dataset import ZARR, write_fake_zarr
from test_diffusion import image_config, keypoint_config, obs_batch, stats_for, train_batch
from test_online_train import TINY as TINY_ONLINE
from test_tdmpc import make_policy as make_tdmpc
from test_tdmpc import observations as tdmpc_observations
from test_tdmpc import training_batch as tdmpc_training_batch
from test_train import TINY as TINY_OFFLINE
from test_train import tiny_tdmpc
from torch.utils._python_dispatch import TorchDispatchMode

import lerobot.training.offline as offline
import lerobot.training.online as online
from lerobot import distributed
from lerobot.accel import accelerated
from lerobot.cli import compose_config, train_main
from lerobot.config import InferenceConfig, env_config
from lerobot.distributed import resolve_device
from lerobot.errors import ConfigError
from lerobot.policies.diffusion.modeling import DiffusionPolicy
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.training.pace import LOWER_STEPS, cpu_run_warning
from lerobot.training.progress import TrainingLoop
from lerobot.training.replay_buffer import ReplayBuffer
from lerobot.training.update import StepMetrics, TrainStep

TORCH_OPTIM = str(Path(torch.optim.__file__).parent)


# ----------------------------------------------------------------------------------------- host reads
class HostReads(TorchDispatchMode):
    """Counts the host's reads of tensor values while active and not `paused`.

    Reads made inside `torch.optim` are left out: AdamW reads its step counter, which lives on the host
    when training on CUDA (PyTorch's default `capturable=False`), so there it costs no device sync.
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.paused = False

    def _counted(self) -> None:
        if self.paused:
            return
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename.startswith(TORCH_OPTIM):
                return
            frame = frame.f_back
        self.count += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self._counted()
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Leave the reads inside the `with` out (host-side data: batches from a dataset, acting)."""
        was, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = was


@pytest.fixture
def host_reads(monkeypatch) -> Iterator[HostReads]:
    counter = HostReads()
    for name in ("tolist", "numpy", "cpu"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, **kwargs):
            counter._counted()
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    with counter:
        yield counter


def paused(counter: HostReads, fn):
    """`fn` with the reads it makes left out."""

    def wrapper(*args, **kwargs):
        with counter.pause():
            return fn(*args, **kwargs)

    return wrapper


def reads_per_iteration(monkeypatch, counter: HostReads) -> list[tuple[int, bool]]:
    """Record, at every `TrainingLoop.advance`, the reads since the previous one and whether a log followed."""
    real_advance = TrainingLoop.advance
    record: list[tuple[int, bool]] = []
    last = {"count": 0}

    def advance(self, n):
        due = real_advance(self, n)
        record.append((counter.count - last["count"], due.log))
        last["count"] = counter.count
        return due

    monkeypatch.setattr(TrainingLoop, "advance", advance)
    return record


def assert_no_reads_between_logs(record: list[tuple[int, bool]]) -> None:
    """Iterations after the first (setup: statistics check) read nothing unless the one before logged."""
    assert len(record) > 4
    after_log = [n for (n, _), (_, logged) in zip(record[1:], record[:-1]) if logged]
    between = [n for (n, _), (_, logged) in zip(record[1:], record[:-1]) if not logged]
    assert between and all(n == 0 for n in between), record
    assert after_log and all(0 < n <= 3 for n in after_log), record


@pytest.fixture(scope="module")
def data_args(tmp_path_factory) -> list[str]:
    base = tmp_path_factory.mktemp("data")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    return [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]


def test_offline_trainer_reads_nothing_back_between_logs(tmp_path, data_args, monkeypatch, host_reads):
    real_cycle = offline.cycle_batches

    def cycle_batches(*args, **kwargs):
        batches = real_cycle(*args, **kwargs)
        while True:  # the dataset's host-side loading is not the device's business
            yield paused(host_reads, next)(batches)

    monkeypatch.setattr(offline, "cycle_batches", cycle_batches)
    record = reads_per_iteration(monkeypatch, host_reads)
    args = [*TINY_OFFLINE, "env=pusht_keypoints", *data_args, "training.steps=12", "training.log_freq=4"]
    assert train_main([*args, "training.save_freq=100", "eval.freq=0", f"output_dir={tmp_path}"]) == 0
    assert_no_reads_between_logs(record)


def test_online_trainer_reads_nothing_back_between_logs(tmp_path, monkeypatch, host_reads):
    # Acting reads the policy's actions on the host (the envs live there): one read per env step, by design.
    # The replay buffer lives on the host whatever the device; its own reads cost no device sync.
    monkeypatch.setattr(online.Collector, "collect", paused(host_reads, online.Collector.collect))
    monkeypatch.setattr(online, "sample_mixed", paused(host_reads, online.sample_mixed))
    monkeypatch.setattr(ReplayBuffer, "__len__", paused(host_reads, ReplayBuffer.__len__))
    record = reads_per_iteration(monkeypatch, host_reads)
    args = [*TINY_ONLINE, "training.steps=40", "training.learning_starts=6", "training.gradient_steps=2"]
    assert train_main([*args, "training.save_freq=100", "eval.freq=0", f"output_dir={tmp_path}"]) == 0
    # An iteration is one collection (2 transitions) and its updates; a log every 10 transitions.
    assert_no_reads_between_logs(record)


def test_step_metrics_accumulate_on_the_device_and_name_the_first_bad_update():
    metrics = StepMetrics()
    for i, loss in enumerate([1.0, 3.0, float("inf"), float("nan"), 2.0]):
        metrics.add({"loss": torch.tensor(loss), "grad_norm": torch.tensor(float(i))}, where=f"step {i + 1}")
    assert metrics.count == 5 and metrics.sums.shape == (2,)
    with pytest.raises(RuntimeError, match="loss is inf at step 3"):
        metrics.check_finite()
    ok = StepMetrics()
    for i in range(70):  # past the initial capacity of the per-update losses
        ok.add({"loss": torch.tensor(float(i)), "grad_norm": torch.tensor(1.0)}, where=f"step {i + 1}")
    ok.check_finite()
    assert ok.pop() == pytest.approx({"loss": 34.5, "grad_norm": 1.0})
    assert ok.pop() == {} and ok.count == 0


def test_a_divergence_found_at_log_time_names_its_step_and_keeps_the_last_good_checkpoint(
    tmp_path, data_args, monkeypatch, capsys
):
    real_forward = DiffusionPolicy.forward
    calls = {"n": 0}

    def nan_on_fifth(self, batch):
        calls["n"] += 1
        out = real_forward(self, batch)
        if calls["n"] == 5:
            out["loss"] = out["loss"] * float("nan")
        return out

    monkeypatch.setattr(DiffusionPolicy, "forward", nan_on_fifth)
    args = [*TINY_OFFLINE, "env=pusht_keypoints", *data_args, "training.steps=8", "training.log_freq=3"]
    assert train_main([*args, "training.save_freq=2", "eval.freq=0", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    # Found at the step-6 log, named at step 5; checkpoint 4 holds the weights that gave it.
    assert "loss is nan at step 5" in err and "000000004 holds the weights that gave it" in err, err
    assert calls["n"] == 6
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["000000002", "000000004", "last"]
    assert (tmp_path / "checkpoints" / "last").resolve().name == "000000002"


# ----------------------------------------------------------------------- tensors follow the weights
@contextlib.contextmanager
def default_device_trap() -> Iterator[None]:
    """Make `meta` the default device: a tensor created without following the weights' device lands there."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def assert_on_cpu(*tensors: torch.Tensor) -> None:
    assert all(t.device.type == "cpu" for t in tensors), [t.device for t in tensors]


@pytest.mark.parametrize("make_config", [keypoint_config, image_config])
@pytest.mark.parametrize("scheduler", ["DDPM", "DDIM"])
def test_diffusion_training_and_chunks_follow_the_weights(make_config, scheduler):
    config = make_config(inference_scheduler=scheduler, num_inference_steps=3)
    policy = DiffusionPolicy(config, stats_for(config))
    batch, obs = train_batch(config, 3), obs_batch(config, 3)
    training = OmegaConf.create({"grad_clip_norm": 10.0, "use_amp": False, "compile": False})
    update = TrainStep(policy, config, training, total_updates=10)
    with default_device_trap():
        output = update(batch, where="step 1")
        policy.eval()
        step_obs = {k: v[:, -1] for k, v in obs.items()}
        first = policy.select_action(step_obs)
        policy.reset([1])  # one env starts over: a chunk for a subset of the envs
        for _ in range(config.n_action_steps):
            action = policy.select_action(step_obs)
    assert_on_cpu(*output.values(), first, action, *update.metrics.sums.unsqueeze(0))
    assert torch.isfinite(action).all()
    assert update.metrics.pop()["loss"] > 0


def test_diffusion_fast_path_fp32_follows_the_weights():
    """The fp32 inference plan (built at the entry of the context) puts nothing on the default device."""
    config = image_config(inference_scheduler="DDIM", num_inference_steps=3)
    policy = DiffusionPolicy(config, stats_for(config)).eval()
    obs = obs_batch(config, 2)
    with default_device_trap(), accelerated(policy, InferenceConfig(fast=True)):
        chunk = policy.predict_action_chunk(obs, generator=torch.Generator().manual_seed(0))
    assert_on_cpu(chunk)


def test_tdmpc_training_and_planning_follow_the_weights():
    policy = make_tdmpc().train()
    training = OmegaConf.create({"grad_clip_norm": 10.0, "use_amp": False, "compile": False})
    update = TrainStep(policy, policy.config, training, total_updates=10)
    obs, batch = tdmpc_observations(3), tdmpc_training_batch(4)
    with default_device_trap():
        output = update(batch, where="update 1")
        policy.update_target()
        policy.eval()
        policy.explore = True
        policy.set_noise_seed(0)
        first = policy.select_action(obs)
        policy.reset([0, 2])  # warm-started plans of the other env kept: a subset planning call
        second = policy.select_action(obs)
        policy.config.use_mpc = False
        policy.reset()
        prior = policy.select_action(obs)
    assert_on_cpu(*output.values(), first, second, prior)


@pytest.mark.parametrize(("name", "env"), [("random", "pusht_keypoints"), ("pusht_scripted", "pusht")])
def test_baselines_follow_the_weights(name, env):
    cfg = compose_config([f"policy={name}", f"env={env}"])
    env_cfg = env_config(cfg)
    policy = make_policy(make_policy_config(cfg.policy, env_cfg)).eval()
    obs = {k: torch.rand(2, *f.shape) for k, f in env_cfg.input_features().items()}
    with default_device_trap():
        actions = [policy.select_action(obs) for _ in range(2)]
    assert_on_cpu(*actions)


# ----------------------------------------------------------------------------------------- selection
def test_device_auto_is_the_default_and_resolves_to_what_is_here(caplog):
    cfg = compose_config(["policy=diffusion", "env=pusht_keypoints"])
    assert cfg.device == "auto"
    expected = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    with caplog.at_level(logging.INFO, logger="lerobot.distributed"):
        assert resolve_device("auto").type == expected
    assert f"device: {expected}" in caplog.text
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:7", "mps"])
def test_an_absent_device_is_a_one_line_error(name, tmp_path, data_args, capsys):
    available = {
        "cuda": torch.cuda.is_available(),
        "cuda:0": torch.cuda.is_available(),
        "cuda:7": torch.cuda.device_count() > 7,
        "mps": torch.backends.mps.is_available(),
    }
    if available[name]:
        pytest.skip(f"{name} is present on this machine")
    with pytest.raises(ConfigError, match=f"device={name} but"):
        resolve_device(name)
    args = [*TINY_OFFLINE, "env=pusht_keypoints", *data_args, f"device={name}", f"output_dir={tmp_path}"]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"device={name} but" in err, err


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cpu:0"])
def test_an_unknown_device_name_is_a_config_error(name):
    with pytest.raises(ConfigError, match="expected auto, cpu, cuda, cuda:N or mps"):
        compose_config(["policy=diffusion", "env=pusht_keypoints", f"device={name}"])


# ------------------------------------------------------------------------------------ CPU pace warning
def test_cpu_run_warning_estimates_hours_and_names_the_recipe():
    # The paper-size image model: ~4.3 s per step on a 2-core CPU, 100k steps.
    warning = cpu_run_warning(step_s=4.3, steps_left=100_000)
    assert "about 119 hours" in warning and warning.endswith(LOWER_STEPS)
    assert cpu_run_warning(step_s=0.19, steps_left=24_000) is None  # the CPU recipe itself: ~1.3 hours


def test_a_slow_cpu_run_warns_at_start_and_still_runs(tmp_path, data_args, monkeypatch, caplog):
    monkeypatch.setattr("lerobot.training.pace.CPU_WARN_HOURS", 1e-7)  # any run is "slow"
    args = [*TINY_OFFLINE, "env=pusht_keypoints", *data_args, "training.steps=4", "eval.freq=0"]
    with caplog.at_level(logging.WARNING, logger="lerobot.training.pace"):
        assert train_main([*args, "device=cpu", f"output_dir={tmp_path}"]) == 0
    cpu_recipe = "+experiment=diffusion_pusht_keypoints_cpu trains the CPU recipe"  # the command knows it
    warnings = [r.getMessage() for r in caplog.records if cpu_recipe in r.getMessage()]
    assert len(warnings) == 1 and "s per step, 1 steps left" in warnings[0]


@pytest.mark.parametrize("native", [True, False])
def test_bf16_settings_follow_what_the_cpu_has(monkeypatch, caplog, native):
    """bf16 on a CPU with AVX2 alone is emulated, many times slower than float32: `training.use_amp=auto`
    trains in bf16 only where the device has native bf16; `true` and `inference.dtype=bfloat16` keep bf16
    but say once that it is slow there, naming the setting to change; `false` is float32 everywhere."""
    monkeypatch.setattr(distributed, "native_bf16", lambda device: native)
    policy = tiny_tdmpc()

    def amp(setting) -> bool:
        training = {"grad_clip_norm": 10.0, "use_amp": setting, "compile": False}
        return TrainStep(policy, policy.config, OmegaConf.create(training), 1).use_amp

    with caplog.at_level(logging.INFO, logger="lerobot.distributed"):
        assert [amp(s) for s in (True, "true", "auto", "false", False)] == [True, True, native, False, False]
        config = keypoint_config()
        diffusion = DiffusionPolicy(config, stats_for(config)).eval()
        with accelerated(diffusion, InferenceConfig(dtype="bfloat16")):
            pass
        with accelerated(diffusion, InferenceConfig()):
            pass
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if native:
        assert warnings == []
    else:
        assert len(warnings) == 3
        for message in warnings[:2]:
            assert message.startswith("training.use_amp=true") and "training.use_amp=auto" in message
        assert warnings[2].startswith("inference.dtype=bfloat16") and warnings[2].endswith(
            "inference.dtype=float32"
        )
    auto = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training.use_amp=auto")]
    assert auto == [
        "training.use_amp=auto: "
        + ("bf16 autocast" if native else "float32 (this CPU has no native bf16 kernels)")
    ]


def test_use_amp_takes_auto_true_or_false():
    assert compose_config(["env=pusht_keypoints", "training.use_amp=auto"]).training.use_amp == "auto"
    assert compose_config(["env=pusht_keypoints", "training.use_amp=true"]).training.use_amp == "true"
    with pytest.raises(ConfigError, match="training.use_amp='fast': expected auto, true or false"):
        compose_config(["env=pusht_keypoints", "training.use_amp=fast"])


def test_native_bf16_on_this_machine_matches_onednn():
    """A GPU always has native bf16; the CPU answer is oneDNN's own."""
    assert distributed.native_bf16(torch.device("cuda"))
    assert distributed.native_bf16(torch.device("cpu")) == torch.ops.mkldnn._is_mkldnn_bf16_supported()
