"""Play an exported ONNX policy with onnxruntime: the example to start a deployment from.

    python -m ppo_ddp.export runs/<run>/model_<run>.pt --format onnx --output policy.onnx
    python examples/play_exported.py policy.onnx --episodes 5

It needs onnxruntime, gymnasium (with mujoco for the MuJoCo robots) and numpy, and neither torch nor ppo_ddp: the
file holds the whole step from the env's raw observation to the action the env receives (observation
normalisation and clipping, the policy's deterministic action, the clip to the action bounds) and says what it is
for in its metadata. Episode i is reset with seed + i, as `python -m ppo_ddp.evaluate` does, so for the same
checkpoint and --seed both print the same returns.

The env defaults to the one in the file's metadata, made with the options it names (env_kwargs: another MJCF
model, its reward weights). ppo_ddp's partly observed envs (ppo_ddp/HopperNoVel-v5, ...)
are registered by the ppo_ddp package, which this script does not import: pass
--env-id ppo_ddp:ppo_ddp/HopperNoVel-v5 and gymnasium imports it to register them, where ppo_ddp is importable
(PYTHONPATH=. from the repository's root; the package's import loads gymnasium and numpy, not torch).
"""

from __future__ import annotations

import argparse
import json
from typing import Optional

import gymnasium as gym
import numpy as np
import onnxruntime as ort


def flat(obs: np.ndarray | dict) -> np.ndarray:
    """The vector the policy reads. A DeepMind Control task (dm_control/...) observes a dict of arrays: ppo_ddp's env
    factory trained on its entries concatenated in sorted key order, each flattened, as float32; so does this."""
    if isinstance(obs, dict):
        return np.concatenate([np.asarray(obs[k], np.float32).ravel() for k in sorted(obs)])
    return np.asarray(obs, np.float32)


def play(session: ort.InferenceSession, env: gym.Env, episodes: int, seed: int) -> list[float]:
    """The undiscounted return of each episode."""
    meta = session.get_modelmeta().custom_metadata_map  # every value a string
    # A recurrent (GRU) policy has a second input, its state h: zeros at the start of every episode, then each
    # step's h_next fed back as the next step's h.
    recurrent = len(session.get_inputs()) == 2
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        h = np.zeros((1, int(meta["rnn_hidden_size"])), np.float32) if recurrent else None
        total, done = 0.0, False
        while not done:
            # a batch of one env; the file takes any number of envs at once
            feed = {"obs": flat(obs)[None]}
            if recurrent:
                feed["h"] = h
            outputs = session.run(None, feed)
            action = outputs[0][0]  # already within the env's action bounds
            if recurrent:
                h = outputs[1]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description="Play an exported ONNX policy with onnxruntime.")
    parser.add_argument("policy", help="the .onnx file written by python -m ppo_ddp.export --format onnx")
    parser.add_argument("--env-id", help="the gymnasium env (default: the one in the file's metadata)")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=12345, help="episode i is reset with seed + i")
    parser.add_argument("--json", action="store_true", help="print the returns as one JSON list instead")
    args = parser.parse_args(argv)

    session = ort.InferenceSession(args.policy, providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    env_id = args.env_id or meta["env_id"]
    if env_id.startswith("dm_control/"):
        import shimmy  # noqa: F401  (registers the dm_control/ ids; gymnasium does not import it by itself)
    options = json.loads(meta.get("env_kwargs", "{}"))  # the robot's options (another MJCF model, its weights)
    try:
        env = gym.make(env_id, **options)
    except gym.error.NamespaceNotFound:  # e.g. ppo_ddp/HopperNoVel-v5: see the top of this file
        raise SystemExit(f"{env_id}: not registered; try --env-id ppo_ddp:{env_id} with PYTHONPATH=.") from None
    obs_dim = flat(env.observation_space.sample()).shape[0]
    if obs_dim != int(meta["obs_dim"]):
        raise SystemExit(f"{env_id}'s observations have {obs_dim} values, the policy's {meta['obs_dim']}")
    try:
        returns = play(session, env, args.episodes, args.seed)
    finally:
        env.close()
    if args.json:
        print(json.dumps(returns))
    else:
        for episode, ret in enumerate(returns):
            print(f"episode {episode} (seed {args.seed + episode}): return {ret:.3f}")
        print(f"{env_id}: mean return {np.mean(returns):.1f} ± {np.std(returns):.1f} over {len(returns)} episodes")


if __name__ == "__main__":
    main()
