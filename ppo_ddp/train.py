"""`python -m ppo_ddp.train [flags]`: train PPO (`--help` lists every flag). The same program as the console script
`ppo-ddp-train` and a checkout's `python train.py`; `torchrun --nproc_per_node=N -m ppo_ddp.train [flags]` runs one
learner per GPU.

In Python, `from ppo_ddp import train` is the function that trains (ppo_ddp/runner/launch.py), not this module: import
neither this module nor `main` from it in a program that uses that function (the import would bind the name
ppo_ddp.train to the module).
"""

from __future__ import annotations

import sys
from typing import Optional

from ppo_ddp.configuration.loading import parse_config


def main(argv: Optional[list[str]] = None) -> None:
    """The command line: the flags are read (one line and exit status 2 on bad input) before torch is imported."""
    cfg = parse_config(argv)
    from ppo_ddp.runner.launch import main as launch

    launch(cfg, None if argv is None else [sys.argv[0], *argv])


if __name__ == "__main__":
    main()
