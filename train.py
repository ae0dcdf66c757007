"""Train PPO from a checkout: `python train.py [flags]` on one machine, `torchrun --nproc_per_node=N train.py [flags]`
on GPUs. The same program as `python -m ppo_ddp.train` and the console script `ppo-ddp-train`."""

from ppo_ddp.train import main

if __name__ == "__main__":
    main()
