"""ppo_ddp: PPO for MuJoCo robots with one learner per GPU (torchrun) and shared-memory actor processes."""

from ppo_ddp import partial_envs

__version__ = "0.1.0"

partial_envs.register()  # the partly observed envs' gymnasium ids, for any library that imports ppo_ddp
