"""LeRobot's evaluation of its PushT-image Diffusion Policy, timed: the peer side of `bench_peer_eval.py`.

    $LEROBOT_VENV/bin/python peer_lerobot_eval.py THREADS N_ENVS N_EPISODES EPISODE_STEPS DDIM_STEPS

Runs under a Python that has LeRobot 0.6.x and gym-pusht installed (it imports nothing from this project).
It builds LeRobot's `DiffusionPolicy` with the PushT image setup of `peer_lerobot_step.py` (random weights:
the compute of a trained model), sampling with DDIM, its pre- and post-processors from made-up dataset
statistics, and `N_ENVS` PushT envs in a `SyncVectorEnv` from LeRobot's own `make_env` (96x96 camera
frames, the size the policy takes; episodes capped at `EPISODE_STEPS`). Then it runs LeRobot's
`eval_policy` (what `lerobot-eval` calls) for `N_EPISODES` episodes under `torch.no_grad()`, with no video,
and prints one line: `seconds <wall time of eval_policy> reward <avg max reward>`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import lerobot

if Path(lerobot.__file__).resolve().parents[1] == Path(__file__).resolve().parents[1]:
    raise SystemExit("this imported the project's own `lerobot`: run with LeRobot's Python, PYTHONPATH unset")

from lerobot.envs.configs import PushtEnv  # noqa: E402
from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy  # noqa: E402
from lerobot.policies.factory import make_pre_post_processors  # noqa: E402
from lerobot.scripts.lerobot_eval import eval_policy  # noqa: E402
from peer_lerobot_step import diffusion_config  # noqa: E402

from lerobot.envs.factory import make_env, make_env_pre_post_processors  # noqa: E402


def made_up_stats() -> dict[str, dict[str, torch.Tensor]]:
    """Mean/std and min/max for the image, state and action: the scale of PushT's, which sets no cost."""
    image = {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25)}
    image |= {"min": torch.zeros(3, 1, 1), "max": torch.ones(3, 1, 1)}
    box = {"mean": torch.full((2,), 256.0), "std": torch.full((2,), 128.0)}
    box |= {"min": torch.zeros(2), "max": torch.full((2,), 512.0)}
    return {"observation.image": image, "observation.state": box, "action": box}


def main() -> None:
    """Build everything, run `eval_policy` once, print its wall time."""
    threads, n_envs, n_episodes, episode_steps, ddim_steps = (int(a) for a in sys.argv[1:6])
    torch.set_num_threads(threads)
    config = diffusion_config(noise_scheduler_type="DDIM", num_inference_steps=ddim_steps)
    torch.manual_seed(0)
    policy = DiffusionPolicy(config).eval()
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=made_up_stats())
    env_cfg = PushtEnv(episode_length=episode_steps, observation_height=96, observation_width=96)
    envs = make_env(env_cfg, n_envs=n_envs, use_async_envs=False)
    env = next(iter(next(iter(envs.values())).values()))
    env_preprocessor, env_postprocessor = make_env_pre_post_processors(env_cfg, config)
    start = time.perf_counter()
    with torch.no_grad():
        info = eval_policy(
            env,
            policy,
            env_preprocessor,
            env_postprocessor,
            preprocessor,
            postprocessor,
            n_episodes=n_episodes,
            start_seed=100000,
        )
    seconds = time.perf_counter() - start
    env.close()
    print(f"seconds {seconds} reward {info['aggregated']['avg_max_reward']}", flush=True)


if __name__ == "__main__":
    main()
