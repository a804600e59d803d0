"""End to end: a tiny TD-MPC run on Pendulum through `scripts/train.py`'s code path, resume, and `scripts/eval.py`."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lerobot.checkpoints.run import load_run_policy, load_training_state
from lerobot.checkpoints.run_layout import latest_checkpoint
from lerobot.cli import compose_config, eval_main, train_main
from lerobot.runtime.checksums import write_checksums
from lerobot.training.schedule import UpdateSchedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tiny import TDMPC_PENDULUM as TINY  # noqa: E402


def records(run_dir: Path, split: str) -> list[dict]:
    with open(run_dir / "metrics.jsonl") as f:
        return [r for r in (json.loads(line) for line in f) if r["split"] == split]


def test_train_resume_and_eval(tmp_path):
    run_dir = tmp_path / "run"
    assert train_main([*TINY, "training.steps=40", "training.save_buffer=true", f"output_dir={run_dir}"]) == 0

    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith("."))
    assert ckpts == ["000000020", "000000040", "last"]
    assert latest_checkpoint(run_dir).name == "000000040"
    state = load_training_state(latest_checkpoint(run_dir))
    # 2 envs -> 2 transitions per vector step; updates = transitions collected once past learning_starts=10.
    schedule = UpdateSchedule(n_envs=2, gradient_steps=-1, learning_starts=10)
    assert state["transitions"] == 40 and state["updates"] == schedule.count_updates(40) == 30
    assert len(state["replay_buffer"]["data"]["valid"]) == 20  # 20 vector steps of 2 envs

    train = records(run_dir, "train")
    assert [r["step"] for r in train] == [10, 20, 30, 40]
    assert sum(r["updates_per_transition"] * 10 for r in train) == 30
    assert all(r["lr"] > 0 and r["env_steps_per_s"] > 0 for r in train)
    assert {"loss", "value_loss", "consistency_loss", "reward_loss", "policy_loss", "grad_norm"} <= set(
        train[-1]
    )
    # Both envs finish their first 12-step episode at vector step 12 (transition 24), logged at 30.
    assert [r.get("episodes_finished") for r in train] == [None, None, 2.0, None]
    assert train[2]["episode_length"] == 12 and train[2]["episode_return"] < 0
    assert [r["step"] for r in records(run_dir, "eval")] == [20, 40]

    # Resume from the saved buffer and continue to 60 transitions.
    assert train_main([*TINY, "training.steps=60", "training.resume=true", f"output_dir={run_dir}"]) == 0
    state = load_training_state(latest_checkpoint(run_dir))
    assert state["transitions"] == 60 and state["updates"] == 50
    assert [r["step"] for r in records(run_dir, "train")] == [10, 20, 30, 40, 50, 60]

    # The checkpoint loads without any dataset and plans within the action bounds.
    policy, cfg = load_run_policy(latest_checkpoint(run_dir))
    action = policy.select_action({"observation.state": torch.tensor([[1.0, 0.0, 0.0]])})
    assert action.shape == (1, 1) and -2 <= float(action) <= 2
    assert cfg.policy.name == "tdmpc"

    info = evaluate_run(run_dir, tmp_path / "eval")
    assert len(info["per_episode"]) == 2 and all(ep["n_steps"] == 12 for ep in info["per_episode"])


def evaluate_run(run_dir: Path, out_dir: Path) -> dict:
    """`scripts/eval.py --checkpoint run_dir` over 2 episodes on 2 envs, no video; its `eval_info.json`."""
    argv = [
        "--checkpoint",
        str(run_dir),
        "--output-dir",
        str(out_dir),
        "eval.n_episodes=2",
        "eval.batch_size=2",
    ]
    assert eval_main([*argv, "eval.max_episodes_rendered=0"]) == 0
    return json.loads((out_dir / "eval_info.json").read_text())


TDMPC2_OPTIONS = [
    "policy.value_bins=11",
    "policy.prior_entropy_coeff=1e-4",
    "policy.activation=mish",
    "policy.q_dropout=0.01",
    "policy.encoder_lr_scale=0.3",
    "policy.q_scale_stat=percentile_range",
    "policy.policy_q_reduction=mean",
]


@pytest.mark.parametrize("tdmpc2", [[], TDMPC2_OPTIONS])
def test_train_with_bf16_autocast(tmp_path, tdmpc2):
    """A short bf16 run logs finite losses, as TD-MPC and with all of TD-MPC2's options (two-hot bins,
    Gaussian prior, Mish, Q dropout, the encoder's learning rate, the percentile Q scale, the mean of Qs)."""
    run_dir = tmp_path / "amp"
    overrides = ["training.steps=30", "training.use_amp=true", *tdmpc2]
    assert train_main([*TINY, *overrides, f"output_dir={run_dir}"]) == 0
    losses = [r["loss"] for r in records(run_dir, "train") if "loss" in r]
    assert losses and all(math.isfinite(v) for v in losses)


def test_config_composes_with_paper_defaults():
    cfg = compose_config(["policy=tdmpc", "env=pusht_keypoints", "training.n_envs=8"])
    assert cfg.policy.num_samples == 512 and cfg.policy.iterations == 6 and cfg.policy.horizon == 5
    assert cfg.training.n_envs == 8


def test_pusht_keypoints_with_demonstrations(tmp_path, pusht_data_root):
    """Online PushT-keypoints run whose batches mix replayed demonstrations (offline_ratio) with own data."""
    overrides = [o for o in TINY if not o.startswith("env")] + [
        "env=pusht_keypoints",
        "env.max_episode_steps=10",
        f"dataset.root={pusht_data_root}",
        "training.offline_ratio=0.5",
        "training.steps=24",
        "training.log_freq=24",
        "eval.freq=0",
        f"output_dir={tmp_path / 'run'}",
    ]
    assert train_main(overrides) == 0
    (train,) = records(tmp_path / "run", "train")
    assert train["updates"] == 14 and train["buffer_size"] == 24
    policy, _ = load_run_policy(latest_checkpoint(tmp_path / "run"))
    obs = {
        "observation.state": torch.full((1, 2), 256.0),
        "observation.environment_state": torch.zeros(1, 16),
    }
    action = policy.select_action(obs)
    assert action.shape == (1, 2) and torch.all((action >= 0) & (action <= 512))


def test_offline_policy_cannot_train_online(tmp_path, capsys):
    args = [
        "policy=diffusion",
        "env=pusht_keypoints",
        "policy.training_mode=online",
        f"output_dir={tmp_path}",
    ]
    assert train_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot learn online" in err and "OnlinePolicy" in err and len(err.splitlines()) == 1, err


def test_non_finite_action_stops_collection_with_one_line(tmp_path, monkeypatch, capsys):
    from lerobot.policies.tdmpc.modeling import TDMPCPolicy

    real = TDMPCPolicy.predict_action_chunk

    def nan_actions(self, batch):
        return real(self, batch) * float("nan")

    monkeypatch.setattr(TDMPCPolicy, "predict_action_chunk", nan_actions)
    assert train_main([*TINY, "training.steps=40", f"output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "non-finite action" in err and "after 10 transitions" in err and "Traceback" not in err


def test_both_trainers_share_one_training_state_and_old_online_checkpoints_resume(tmp_path):
    """The online trainer keeps the offline trainer's layout (`model`, `optimizer`, `scheduler`, `ema`); a
    checkpoint in the layout it wrote before (weights only in model.safetensors, `lr_scheduler`) resumes to
    the same weights."""
    runs = {name: tmp_path / name for name in ("new", "old")}
    for run_dir in runs.values():
        assert (
            train_main([*TINY, "training.steps=20", "training.save_buffer=true", f"output_dir={run_dir}"])
            == 0
        )
    ckpt = latest_checkpoint(runs["old"])
    state = load_training_state(ckpt)
    assert {"model", "optimizer", "scheduler", "ema"} <= set(state) and state["ema"] is None
    del state["model"], state["ema"]
    state["lr_scheduler"] = state.pop("scheduler")
    torch.save(state, ckpt / "training_state.pt")
    write_checksums(ckpt)
    for run_dir in runs.values():
        assert (
            train_main([*TINY, "training.steps=40", "training.save_buffer=true", f"output_dir={run_dir}"])
            == 0
        )
    new, old = (load_file(latest_checkpoint(r) / "model.safetensors") for r in runs.values())
    assert new.keys() == old.keys() and all(torch.equal(new[k], old[k]) for k in new)


def test_a_branch_starts_from_another_runs_checkpoint_under_a_changed_config(tmp_path, capsys):
    base = tmp_path / "base"
    assert train_main([*TINY, "training.steps=20", "training.save_buffer=true", f"output_dir={base}"]) == 0
    assert load_training_state(latest_checkpoint(base))["updates"] == 10

    # Twice the updates per transition and a third of the learning rate, from the base run's checkpoint.
    branch = tmp_path / "branch"
    argv = [*TINY, "training.utd_ratio=2", "policy.optimizer_lr=1e-4", "training.save_buffer=true"]
    argv += ["eval.freq=0", f"training.init_from={base}", f"output_dir={branch}"]
    assert train_main([*argv, "training.steps=40"]) == 0
    state = load_training_state(latest_checkpoint(branch))
    assert state["transitions"] == 40 and state["updates"] == 10 + 2 * 20
    assert len(state["replay_buffer"]["data"]["valid"]) == 20  # the base's 10 vector steps and 10 new ones
    assert all(math.isclose(g["lr"], 1e-4) for g in state["optimizer"]["param_groups"])
    assert [r["step"] for r in records(branch, "train")] == [30, 40]
    assert latest_checkpoint(base).name == "000000020"  # the base run is left as it was

    # A relaunch resumes the branch itself.
    assert train_main([*argv, "training.steps=60"]) == 0
    assert load_training_state(latest_checkpoint(branch))["updates"] == 10 + 2 * 40

    # A branch may not change the model's shape, and needs a checkpoint to start from.
    wider = [*TINY, "policy.mlp_dim=64", f"training.init_from={base}", f"output_dir={tmp_path / 'wide'}"]
    assert train_main([*wider, "training.steps=40"]) == 2
    assert "do not fit this policy's config" in capsys.readouterr().err
    empty = [*TINY, f"training.init_from={tmp_path / 'nothing'}", f"output_dir={tmp_path / 'b2'}"]
    assert train_main([*empty, "training.steps=40"]) == 2
    assert "is neither a run directory with a checkpoint" in capsys.readouterr().err


def test_the_trainer_tells_the_policy_its_progress_before_every_step(tmp_path, monkeypatch):
    """`set_progress` hears the transitions collected so far before each vector step (what TD-MPC's
    warm-up schedules follow), and with a schedule the planner ends the run at its final values."""
    from lerobot.policies.tdmpc.modeling import TDMPCPolicy

    heard, planners = [], []
    original = TDMPCPolicy.set_progress

    def spy(self, transitions):
        heard.append(transitions)
        planners.append(self.planner)
        original(self, transitions)

    monkeypatch.setattr(TDMPCPolicy, "set_progress", spy)
    overrides = [
        *TINY,
        "training.steps=20",
        "eval.freq=0",
        "policy.schedule_steps=12",
        f"output_dir={tmp_path}",
    ]
    assert train_main(overrides) == 0
    assert heard == list(range(0, 20, 2))  # 2 envs: 2 transitions per vector step
    assert planners[-1].s.horizon == 3 and planners[-1].std_floor == pytest.approx(0.05)


def test_prioritized_replay_writes_the_policys_priorities_back(tmp_path, capsys):
    """`training.per_alpha > 0`: every update's TD errors become the priorities of the starts it drew, saved
    with the buffer; a bad exponent is one line."""
    run = tmp_path / "per"
    argv = [*TINY, "training.per_alpha=0.6", "training.save_buffer=true", "eval.freq=0", f"output_dir={run}"]
    assert train_main([*argv, "training.steps=20"]) == 0
    buffer = load_training_state(latest_checkpoint(run))["replay_buffer"]
    priority = buffer["data"]["priority"]
    written = priority != 1.0  # new rows take the largest priority so far: 1 before the first write-back
    assert written.any() and torch.all(priority > 0)
    assert buffer["max_priority"] >= float(priority.max()) > 1.0  # the largest ever written
    assert train_main([*argv, "training.steps=40"]) == 0  # resumes, priorities and all

    assert train_main([*TINY, "training.per_beta=1.5", f"output_dir={tmp_path / 'bad'}"]) == 2
    assert "training.per_beta=1.5" in capsys.readouterr().err
