"""ppo_ddp: PPO for MuJoCo robots with one learner per GPU (torchrun) and shared-memory actor processes."""
