"""ppo_ddp: PPO for MuJoCo robots with one learner per GPU (torchrun) and shared-memory actor processes.

The Python API, for notebooks and scripts (docs/usage.md, "Python API"):

    from ppo_ddp import Config, load_config, train

    if __name__ == "__main__":  # the actor processes import this script again
        checkpoint = train("hopper", seed=2)      # Hopper-v5's preset; or train(Config(...)), train(env_id=...)

The command line is `python -m ppo_ddp.train` (ppo-ddp-train), `ppo_ddp.evaluate`, `ppo_ddp.export` and
`ppo_ddp.tune`.
"""

import importlib
from typing import Any

from ppo_ddp.envs import partial as partial_envs

__version__ = "0.1.0"
__all__ = ["Config", "load_config", "train"]

_API = {
    "Config": "ppo_ddp.configuration.config",
    "load_config": "ppo_ddp.configuration.loading",
    "train": "ppo_ddp.runner.launch",
}
"""Each name of the API and the module that defines it: the one table `__getattr__` reads, which
tests/test_docs_code.py holds to `__all__`, so a function that moves breaks a test rather than a user's import."""

partial_envs.register()  # the partly observed envs' gymnasium ids, for any library that imports ppo_ddp


def __getattr__(name: str) -> Any:
    """The API's names, imported when first used: `import ppo_ddp` stays light (no torch) for the processes that
    only need an env id registered or a config read."""
    if name not in _API:
        raise AttributeError(f"module 'ppo_ddp' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
