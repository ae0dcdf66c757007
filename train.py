"""Train PPO: `python train.py [flags]` on one machine, `torchrun --nproc_per_node=N train.py [flags]` on GPUs."""

from ppo_ddp.config import parse_config

if __name__ == "__main__":
    cfg = parse_config()
    from ppo_ddp.launch import main

    main(cfg)
