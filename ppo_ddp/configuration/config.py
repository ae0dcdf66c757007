"""The one Config of a training run, and the types of its values as YAML gives them. Every value is checked before
any process, env or collective starts (ppo_ddp/configuration/validation.py), and a bad one is a ConfigError that
names the field, the value and what is allowed (one line on stderr and exit status 2 from the command line). Where a
run's values come from (a preset or YAML file, flags, keyword fields) is ppo_ddp/configuration/loading.py.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, Union

from ppo_ddp.configuration.flags import JSON_OBJECT, said
from ppo_ddp.envs.options import plain
from ppo_ddp.errors import ConfigError


@dataclass(frozen=True)
class Config:
    """PPO for MuJoCo robots: one learner per GPU (torchrun), each fed by its own actor processes."""

    # ---- what to train ----------------------------------------------------
    env_id: str = "HalfCheetah-v5"
    """Gymnasium id of the environment (continuous actions: Hopper-v5, Ant-v5, dm_control/cheetah-run-v0)."""
    env_kwargs: Annotated[dict[str, Any], JSON_OBJECT] = dataclasses.field(default_factory=dict)
    """Options of the env, the keywords gym.make passes to its class, in every env of the run (actors, evaluation,
    videos, evaluate, export): another MJCF model and its settings, e.g. '{"xml_file": "robots/my.xml",
    "frame_skip": 5, "ctrl_cost_weight": 0.01}' (JSON on the command line, a mapping in YAML). A relative xml_file
    is made absolute against the directory you run from, as config.yaml and checkpoints record it. Checked against
    the env class's keywords before the run starts; a resume must have the same."""
    seed: int = 1
    """Seed of the run; every env gets its own seed derived from (seed, rank, actor, env)."""
    total_timesteps: int = 1_000_000
    """Env steps to train for, counted over all ranks and actors."""

    # ---- processes ----------------------------------------------------------
    num_gpus: int = 1
    """Learners (one per GPU) of `python train.py`: fewer if fewer GPUs are seen, one on CPU; torchrun: its world."""
    num_actors: Optional[int] = None
    """Actor processes over all learners; must equal num_gpus * actors_per_gpu when both are given."""
    actors_per_gpu: Union[int, Literal["auto"]] = "auto"
    """Actor processes per learner. "auto": from the cores this process may use (its CPU affinity, a container's
    CPU quota) shared among the node's learners, the most that split num_envs evenly (2 x 8 on 2 cores, 16 x 1 on
    16); num_actors / num_gpus where num_actors is given. The split never changes the run (docs/design.md,
    "Splits")."""
    num_envs: Optional[int] = None
    """Envs each learner steps per round, spread evenly over its actors (a round is world_size * num_envs *
    rollout_length env steps). None: actors_per_gpu * envs_per_actor where both are numbers, else 16."""
    envs_per_actor: Optional[int] = None
    """Gymnasium envs each actor steps in lockstep (batched policy inference). None: num_envs / actors; a number
    with actors_per_gpu "auto" fixes the actors at num_envs / envs_per_actor."""
    batch_envs: bool = True
    """Step an actor's HalfCheetah, Hopper, Walker2d or Swimmer (v5) envs together with MuJoCo's batch stepping
    and numpy, bit-identical to gymnasium's env.step and ~a quarter cheaper (ppo_ddp/envs/group.py). Other envs are
    always stepped by gymnasium; False steps these ones by gymnasium too."""
    rollout_length: int = 128
    """Steps per env per round; a round is world_size * num_envs * rollout_length env steps."""
    sync_mode: Literal["params", "gradients"] = "params"
    """How the learners stay in step. "params": each trains on its own rollout and their parameters are averaged
    every param_sync_interval rounds. "gradients": the flat gradient is averaged over ranks at every mini-batch
    step (as DistributedDataParallel does), so N ranks act as one learner with N times the mini-batch and their
    parameters are identical after every step."""
    param_sync_interval: int = 1
    """With sync_mode "params": average the learners' parameters every this many rounds (1: identical every
    round)."""
    overlap: bool = False
    """Overlapped rounds: the actors collect round k+1 while the learner updates on round k, instead of waiting for
    it. Round k+1 then acts with the weights of round k-1 (one round of policy lag) and the statistics merged after
    round k; PPO's clip is centred on the weights the update starts from and each sample weighted by their
    probability over the behaviour policy's (the decoupled objective). A round takes about the longer of rollout and
    update instead of their sum (docs/design.md, "overlapped rounds")."""
    mp_start_method: Literal["forkserver", "spawn"] = "forkserver"
    """How actor processes start; both are safe with CUDA and threads (fork is not)."""
    learner_threads: int = 1
    """CPU threads of a CPU learner's update. In sync rounds the actors wait during the update, so the cores they
    step on are free then: 2 threads halve the update of the large-batch presets on 2 cores (docs/tuning.md,
    large-batch), while mini-batches of 64 run fastest on one. With overlap the actors step meanwhile: the learner
    then takes at most the cores its actors leave (one at least)."""
    compile: bool = True
    """Compile the PPO mini-batch step (forward, loss, backward, clip and Adam) into one graph with torch.compile:
    a default round's update ran 2.8-3.9x faster on the 2-core machine (docs/benchmarks/throughput.md). Costs
    ~20-25 s at start the first time a machine sees a network and mini-batch shape, ~5 s once inductor's on-disk
    cache has it. Where it cannot compile (no C++ compiler, an unsupported platform, a compiler error) the run
    says why once and trains eagerly, as --no-compile does."""
    actor_timeout: float = 60.0
    """Seconds an actor may take beyond the expected round time before the learner declares it stuck."""

    # ---- PPO ----------------------------------------------------------------
    learning_rate: float = 3e-4
    """Adam learning rate at the start of training."""
    anneal_lr: bool = True
    """Decay the learning rate linearly to 0 over total_timesteps."""
    adaptive_lr: bool = False
    """Adapt the learning rate to the policy's KL after each round instead (rl_games' "adaptive" schedule): divide
    it by 1.5 when the round's KL, averaged over ranks, exceeded 2 * lr_kl_target, multiply it by 1.5 when it
    was below lr_kl_target / 2, within [1e-6, 1e-2]. Needs anneal_lr off."""
    lr_kl_target: float = 0.008
    """The KL the adaptive learning rate aims at."""
    gamma: float = 0.99
    """Discount factor, in (0, 1]."""
    gae_lambda: float = 0.95
    """GAE lambda, in [0, 1]."""
    update_epochs: int = 10
    """Passes over each round's data."""
    num_minibatches: int = 32
    """Mini-batches per epoch on each learner; must divide num_envs * rollout_length."""
    norm_adv: bool = True
    """Normalise advantages with the mean/std over all ranks' data of the round (with recompute_advantages: over
    this rank's data, at each epoch)."""
    recompute_advantages: bool = False
    """Recompute advantages and value targets with the current critic before every epoch (Tianshou's recompute_adv,
    "What Matters in On-Policy RL"), so later epochs see a critic that learned from the round. Policy "mlp" only."""
    clip_coef: float = 0.2
    """PPO surrogate clipping coefficient."""
    clip_vloss: bool = True
    """Clip the value loss around the old values, as CleanRL does."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Gradient clipping by global norm."""
    bounds_loss_coef: float = 0.0
    """Weight of the squared norm of the Gaussian's mean (averaged over samples) in the loss: rl_games' bounds loss
    of type "regularisation", which keeps the mean of a large network's policy near the action range the env clips
    actions to (0: no such term). With a bounded distribution it is the policy head's output (tanh_gaussian: the
    mean before the squashing; beta: the logit of the Beta's position)."""
    target_kl: Optional[float] = None
    """Stop the round's epochs early once the approximate KL exceeds this (None: never)."""
    lag_weight_max: Optional[float] = None
    """With overlap: truncate each sample's weight pi_start / pi_behaviour (the decoupled objective's correction for
    the round of lag) at this, as V-trace truncates its importance weights at rho-bar (None: not truncated)."""

    # ---- model --------------------------------------------------------------
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the policy and value MLPs."""
    activation: Literal["tanh", "relu", "elu"] = "tanh"
    """Hidden activation."""
    shared_trunk: bool = False
    """Policy and value share one MLP of hidden_sizes and differ only in their linear output layers (rl_games'
    `separate: False`): half the arithmetic of two MLPs of the same widths, and the value loss (vf_coef) shapes
    the policy's features too. Policy "mlp" only (a GRU's core is always shared)."""
    critic_obs: Optional[str] = None
    """An asymmetric actor-critic: the key of the env's `info` (at reset and every step) whose array the critic
    reads instead of the policy's observation, privileged information the deployed policy will not have (the
    partly observed envs give "full_obs", their velocities included). It has its own normalisation statistics
    (normalize_obs), and with policy "gru" the critic is an MLP of hidden_sizes on it rather than a head on the
    GRU. The policy, evaluation and export are unchanged. None: the critic sees the policy's observation."""
    log_std_init: float = -1.0
    """Initial state-independent log standard deviation of the policy (-1.0: std 0.37 for actions in [-1, 1];
    a bounded distribution's in half-ranges of the bounds; with CleanRL's 0.0, half the HalfCheetah seeds settled
    in a slow gait, docs/tuning.md)."""
    distribution: Literal["gaussian", "beta", "tanh_gaussian"] = "gaussian"
    """The policy's action distribution (ppo_ddp/models/distributions.py, docs/design.md). "gaussian": a Normal
    whose samples the env clips to the action space's bounds. "tanh_gaussian": a Normal squashed by tanh onto the
    bounds; "beta": a Beta distribution on them (its position from the network, its concentration a learned
    parameter that log_std_init starts at the std it names, at most half the half-range). The bounded two put no
    mass beyond a bound and the action stored is the one the env got."""
    policy: Literal["mlp", "gru"] = "mlp"
    """"mlp", or "gru" for robots that must remember what they saw (partly observed envs): an MLP encoder of
    hidden_sizes, a GRU of rnn_hidden_size and linear heads for the action mean and the value, one core for both
    (ppo_ddp/models/gru.py, docs/design.md)."""
    rnn_hidden_size: int = 64
    """Width of the GRU's state (policy "gru")."""
    rnn_head_sizes: tuple[int, ...] = ()
    """Hidden widths of an MLP on the GRU's state, between it and the linear heads (policy "gru"), so that the action
    is not linear in the memory. (): the heads read the state itself."""
    seq_length: int = 16
    """Steps per chunk of policy "gru" (a divisor of rollout_length): the update shuffles whole chunks and unrolls
    each from the state its actor had entering it, backpropagating through at most this many steps."""

    # ---- normalisation ------------------------------------------------------
    normalize_obs: bool = True
    """Normalise observations with running statistics merged over all actors and ranks."""
    obs_clip: float = 10.0
    """Clip normalised observations to [-obs_clip, obs_clip]."""
    normalize_reward: bool = True
    """Scale rewards by the running std of the discounted return (as gymnasium's NormalizeReward)."""
    reward_clip: float = 10.0
    """Clip scaled rewards to [-reward_clip, reward_clip]."""
    normalize_value: bool = False
    """The critic learns normalised returns: targets and old values are standardised with running statistics of
    the returns merged over all actors and ranks (saved in checkpoints); actors de-normalise its output."""

    # ---- evaluation ---------------------------------------------------------
    eval_interval: int = 50
    """Evaluate the rank-averaged policy every this many rounds and after the last one (0: never), in a process of
    its own while training goes on; the best checkpoint is then the policy that evaluated best (with 0: the best
    mean training return). On by default: it cost the 1M-step quickstart no measurable time (README)."""
    eval_episodes: int = 10
    """Deterministic episodes of each evaluation, on an env seeded apart from the training envs."""
    capture_video: bool = False
    """Record the first episode of each evaluation, with a camera that follows the robot, to
    runs_dir/run_name/videos/ (mp4) and TensorBoard (and W&B). Needs eval_interval, moviepy (pip install moviepy)
    and a MuJoCo renderer (without a display MUJOCO_GL=egl is tried, or set MUJOCO_GL=osmesa); a run that cannot
    render refuses at start."""

    # ---- tracking -----------------------------------------------------------
    track: bool = False
    """Track the run in Weights & Biases from rank 0: the resolved config and git commit as the run's config, the
    TensorBoard scalars synced, the same W&B run continued on resume. Needs wandb (pip install wandb); works
    offline with WANDB_MODE=offline."""
    wandb_project: str = "ppo_ddp"
    """W&B project of --track."""
    wandb_entity: Optional[str] = None
    """W&B entity (user or team) of --track (default: your W&B default entity)."""
    wandb_group: Optional[str] = None
    """W&B group of --track, e.g. the seeds of one experiment."""
    wandb_tags: tuple[str, ...] = ()
    """W&B tags of --track."""

    # ---- outputs ------------------------------------------------------------
    run_name: Optional[str] = None
    """Name of the run folder runs_dir/run_name (default: <env_id>__<seed>__<start time>, a namespaced id's '/' as
    '-')."""
    runs_dir: str = "runs"
    """Folder that holds one subfolder per run."""
    metrics_path: Optional[str] = None
    """CSV of per-round metrics (default: runs_dir/run_name/metrics.csv)."""
    save_interval: int = 5
    """Write the latest checkpoint every this many rounds (and at the end, and on a stop signal)."""
    resume: Optional[str] = None
    """Resume from a checkpoint: a path, or 'auto' for the latest checkpoint of run_name (fresh if it has none)."""

    config: Optional[str] = None
    """A preset's name (hopper, scale/humanoid: ppo_ddp/configs/) or a YAML file, whose keys set defaults for the
    fields above; flags override it. Without it, the preset of env_id (hopper for Hopper-v5), or Config's defaults
    for an env that has none."""


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(Config)]


YAML_EXPONENT_HINT = "YAML reads 1e-4 as text: write 1.0e-4"
"""PyYAML follows YAML 1.1, where a float needs a dot: the commonest reason a learning rate is not a number."""


def invalid(name: str, value: Any, allowed: str) -> ConfigError:
    """The error of a bad value: one line, `name=value: what is allowed` (exit status 2 from the command line)."""
    return ConfigError(said(name, value, allowed))


def coerce(name: str, annotation: Any, value: Any) -> Any:
    """Check a YAML value against the field's type, converting only where YAML cannot say it (list → tuple,
    int → float)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union:  # Optional[X], or a number or a word (actors_per_gpu: int or "auto")
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for choice in inner[1:]:
            if typing.get_origin(choice) is Literal and value in typing.get_args(choice):
                return value
        if len(inner) > 1 and not (isinstance(value, int) and not isinstance(value, bool)):
            words = ", ".join(str(w) for c in inner[1:] for w in typing.get_args(c))
            raise invalid(name, value, f"must be an integer or {words}")
        return coerce(name, inner[0], value)
    if origin is Literal:
        if value not in args:
            raise invalid(name, value, f"must be one of {', '.join(map(str, args))}")
        return value
    if origin is tuple:  # tuple[int, ...] or tuple[str, ...]
        item = args[0]
        if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, item) and not isinstance(v, bool) for v in value
        ):
            raise invalid(name, value, f"must be a list of {'integers' if item is int else 'strings'}")
        return tuple(value)
    if annotation is bool:
        if not isinstance(value, bool):
            raise invalid(name, value, "must be true or false")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(name, value, "must be an integer")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise invalid(
                name, value, "must be a number" + (f" ({YAML_EXPONENT_HINT})" if isinstance(value, str) else "")
            )
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise invalid(name, value, "must be a string")
        return value
    if origin is dict:  # env_kwargs: the env class checks the values themselves (validation)
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise invalid(name, value, "must be a mapping of option names to values")
        return dict(value)
    raise TypeError(f"no YAML coercion for field {name} of type {annotation}")  # a programming error


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain types only (tuples → lists, within env_kwargs too), for YAML files and weights_only checkpoints."""
    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}


def config_from_dict(values: dict[str, Any]) -> Config:
    """Inverse of config_to_dict; keys this version does not know are ignored (older/newer checkpoints)."""
    known = set(field_names())
    hints = typing.get_type_hints(Config)
    if "actors_per_gpu" in values and values["actors_per_gpu"] is None:  # the default before issue 72's "auto"
        values = {**values, "actors_per_gpu": "auto"}
    return Config(**{k: coerce(k, hints[k], v) for k, v in values.items() if k in known})
