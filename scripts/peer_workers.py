"""The peers' runs for scripts/bench_peers.py, each in a process of its own: SB3's PPO with the rl-baselines3-zoo's
hyperparameters (in the project's venv) and rl_games' PPO on its stock EnvPool config (in .venv-peers). Each prints a
progress line, env steps and the training return over the last 100 episodes, that bench_peers stamps on arrival.

    python scripts/peer_workers.py sb3 Hopper-v5 1
    .venv-peers/bin/python scripts/peer_workers.py rl_games Hopper-v5 1
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ZOO = {  # rl-baselines3-zoo's hyperparams/ppo.yml (its v4 entries; Ant-v4: its MuJoCo defaults), normalize: true
    "HalfCheetah-v5": dict(n_steps=512, batch_size=64, gamma=0.98, learning_rate=2.0633e-05, ent_coef=0.000401762,
                           clip_range=0.1, n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096),
    "Hopper-v5": dict(n_steps=512, batch_size=32, gamma=0.999, learning_rate=9.80828e-05, ent_coef=0.00229519,
                      clip_range=0.2, n_epochs=5, gae_lambda=0.99, max_grad_norm=0.7, vf_coef=0.835671),
    "Walker2d-v5": dict(n_steps=512, batch_size=32, gamma=0.99, learning_rate=5.05041e-05, ent_coef=0.000585045,
                        clip_range=0.1, n_epochs=20, gae_lambda=0.95, max_grad_norm=1, vf_coef=0.871923),
    "Ant-v5": dict(),
    "Humanoid-v5": dict(n_steps=512, batch_size=256, gamma=0.95, learning_rate=3.56987e-05, ent_coef=0.00238306,
                        clip_range=0.3, n_epochs=5, gae_lambda=0.9, max_grad_norm=2, vf_coef=0.431892),
}  # fmt: skip
ZOO_STEPS = {"Humanoid-v5": 10_000_000}  # n_timesteps; 1e6 for the others
ZOO_NET = ("Ant-v5",)  # the envs that keep SB3's default policy (64-64 tanh, log_std 0); the rest: the zoo's below


def progress(steps: int, ret: float) -> None:
    """A worker's line for the parent: env steps and the training return so far (stamped when it arrives)."""
    print(json.dumps({"steps": int(steps), "return": float(ret)}), flush=True)


def sb3_worker(env_id: str, seed: int) -> None:
    """SB3's PPO with the zoo's hyperparameters for env_id, in this process; a progress line per rollout."""
    import torch.nn as nn
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    hyper = ZOO[env_id]
    env = VecNormalize(make_vec_env(env_id, n_envs=1, seed=seed), gamma=hyper.get("gamma", 0.99))
    policy_kwargs = None
    if env_id not in ZOO_NET:
        policy_kwargs = dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU,
                             net_arch=dict(pi=[256, 256], vf=[256, 256]))  # fmt: skip

    class Progress(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            infos = self.model.ep_info_buffer  # the last 100 episodes (Monitor, raw rewards)
            if infos:
                progress(self.num_timesteps, sum(i["r"] for i in infos) / len(infos))

    model = PPO("MlpPolicy", env, seed=seed, policy_kwargs=policy_kwargs, verbose=0, device="cpu", **hyper)
    model.learn(ZOO_STEPS.get(env_id, 1_000_000), callback=Progress())


def rl_games_worker(env_id: str, seed: int) -> None:
    """rl_games' PPO on its stock <env>_envpool.yaml (v5, on the CPU), in this process; a progress line an epoch."""
    import rl_games
    import yaml
    from rl_games.common.algo_observer import DefaultAlgoObserver
    from rl_games.torch_runner import Runner

    stock = Path(rl_games.__file__).parent / "configs" / "mujoco" / f"{env_id.split('-')[0].lower()}_envpool.yaml"
    params = yaml.safe_load(stock.read_text().replace("-v4", "-v5"))["params"]
    params["seed"] = seed
    config = params["config"]
    config["env_config"]["seed"] = seed
    config.update(device="cpu", device_name="cpu", mixed_precision=False)

    class Progress(DefaultAlgoObserver):
        def after_print_stats(self, frame: int, epoch_num: int, total_time: float) -> None:
            super().after_print_stats(frame, epoch_num, total_time)
            if self.algo.game_rewards.current_size > 0:  # the last 100 episodes (raw rewards, before shaping)
                # `frame` is the count from before the epoch it reports on; the algo's own is after it
                progress(self.algo.frame // self.algo.num_agents, float(self.algo.game_rewards.get_mean()[0]))

    runner = Runner(algo_observer=Progress())
    runner.load({"params": params})
    runner.run({"train": True, "play": False, "checkpoint": None, "sigma": None})


if __name__ == "__main__":
    trainer, env_id, seed = sys.argv[1:4]
    {"sb3": sb3_worker, "rl_games": rl_games_worker}[trainer](env_id, int(seed))
