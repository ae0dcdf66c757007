"""The published PPO figures the learning benchmark compares with, and where each is from (returns_tables.py's tables,
the README's): one place, so a figure and its source change together."""

# Published numbers at 10M env steps (issue 13): Sample Factory APPO; rl_games PPO with EnvPool, training return read
# off its published curves (mujoco_humanoid_envpool.png, mujoco_ant_envpool.png: v4 envs, one seed; Ant's ends at 8M);
# the targets of issue 45.
REFERENCE_10M = {
    "Humanoid-v5": ("5439 ± 1314", "~9,500 (v4)", ">= 8000"),
    "Ant-v5": ("5876 ± 167", "~6,200 at 8M (v4)", ">= 6500"),
}

# CleanRL's PPO on the DeepMind Control Suite at 1M env steps: training return (issue 27; docs/tuning.md).
REFERENCE_DMC = {"dm_control/cheetah-run-v0": "432.6 ± 82.5", "dm_control/walker-walk-v0": "392.5 ± 56.3"}

# The best published PPO figure at 1M env steps for each of gymnasium's MuJoCo envs that we found (issue 28), and
# where it is from. They measure different things: Tianshou's is the best point of the mean evaluation curve
# (optimistic), the zoo's one run's deterministic evaluation, CleanRL's the training return (pessimistic).
TIANSHOU = "Tianshou, examples/mujoco README: PPO, 10 seeds, max average return"
REFERENCE = {
    "HalfCheetah-v5": ("5819 ± 664", "rl-baselines3-zoo benchmark.md: tuned PPO, 1 run, deterministic eval (v3)"),
    "Hopper-v5": ("2609 ± 701", f"{TIANSHOU} (v3)"),
    "Walker2d-v5": ("3589 ± 757", f"{TIANSHOU} (v3)"),
    "Ant-v5": ("3258 ± 1079", f"{TIANSHOU} (v3)"),
    "Humanoid-v5": ("787 ± 194", f"{TIANSHOU} (v3)"),
    "HumanoidStandup-v5": (
        "135854 ± 21037",
        "PDARL README: its PPO baseline (Tianshou 1.2.0), 10 seeds, mean of the last 5 epochs (v4)",
    ),
    "InvertedPendulum-v5": ("1000 ± 0", f"{TIANSHOU} (v2)"),
    "InvertedDoublePendulum-v5": ("9231 ± 270", f"{TIANSHOU} (v2)"),
    "Pusher-v5": ("-40.4 ± 7.2", "CleanRL ppo_continuous_action: 3 seeds, training return (v4)"),
    "Reacher-v5": ("-4.1 ± 0.3", f"{TIANSHOU} (v2)"),
    "Swimmer-v5": ("281.6 ± 9.7", "rl-baselines3-zoo benchmark.md: tuned PPO, 1 run, deterministic eval (v3)"),
}


def published_means(reference: dict[str, tuple[str, ...]], envs) -> dict[str, float]:
    """The mean of each env's published figure ("5819 ± 664" -> 5819.0), for the envs of `envs` that have one."""
    return {env: float(reference[env][0].split(" ±")[0]) for env in envs if env in reference}
