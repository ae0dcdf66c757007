"""Whether a row's policy outputs depend on the call it is computed in, on this CPU (docs/design.md, "Splits").

    python scripts/kernel_rows.py

For the presets' networks (Hopper's 64-64 tanh MLP, Humanoid's observation on it, scale/humanoid's 512-256-128 ELU
MLP, a GRU), with one BLAS thread as in the actors:

1. split: 16 rows computed in calls of m rows (the last call short where m does not divide 16) against one call of
   16, by the actors' numpy kernel and by torch's model (`forward` of the same weights); "=" where every output is
   the same bits.
2. place: in calls of exactly m rows, one row put at every place among random other rows; "=" where its outputs
   never change. The actors' FixedRows relies on this for m = kernel_rows(N).
"""

from __future__ import annotations

import functools
import os

if __name__ == "__main__":  # one BLAS thread, as ppo_ddp/sampling/children.py starts the actors (before numpy loads)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ppo_ddp.configuration.config import Config  # noqa: E402
from ppo_ddp.models.factory import make_model  # noqa: E402
from ppo_ddp.models.kernels import make_kernel  # noqa: E402

NETWORKS = {
    "mlp 64-64 tanh, obs 11": (11, 3, {}),
    "mlp 64-64 tanh, obs 348": (348, 17, {}),
    "mlp 512-256-128 elu, obs 348": (348, 17, {"hidden_sizes": (512, 256, 128), "activation": "elu"}),
    "gru 64, obs 17": (17, 6, {"policy": "gru", "rnn_hidden_size": 64}),
}
ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)


def network(obs_dim: int, act_dim: int, options: dict):
    torch.manual_seed(0)
    cfg = Config(**options)
    bounds = (np.full(act_dim, -1, np.float32), np.full(act_dim, 1, np.float32))
    model = make_model(cfg, obs_dim, act_dim, 0, bounds)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return cfg, model, make_kernel(model, cfg.activation)


def numpy_outputs(kernel, obs, state):
    return [o for o in kernel.step(obs, state) if o is not None]


def torch_outputs(model, cfg, obs, state):
    with torch.no_grad():
        x = torch.from_numpy(obs)
        if cfg.policy == "gru":
            out = model.forward_chunks(x[:, None], torch.from_numpy(state), torch.zeros(len(obs), 1))
            return [o.numpy().reshape(len(obs), -1) for o in out[:2]]
        return [model.actor_mean(x).numpy(), model.value(x).numpy()]


def split_equal(step, n: int, m: int, rng) -> bool:
    obs, state = rng.standard_normal((n, step.obs_dim)).astype(np.float32), step.state(n, rng)
    whole = step(obs, state)
    parts = [step(obs[i : i + m], None if state is None else state[i : i + m]) for i in range(0, n, m)]
    return all(np.array_equal(np.concatenate([p[j] for p in parts]), w) for j, w in enumerate(whole))


def place_equal(step, m: int, rng) -> bool:
    row, row_state = rng.standard_normal((1, step.obs_dim)).astype(np.float32), step.state(1, rng)
    reference = None
    for _ in range(5):
        obs, state = rng.standard_normal((m, step.obs_dim)).astype(np.float32), step.state(m, rng)
        for p in range(m):
            obs[p] = row[0]
            if state is not None:
                state[p] = row_state[0]
            got = [o[p].copy() for o in step(obs, state)]
            if reference is None:
                reference = got
            elif not all(np.array_equal(a, b) for a, b in zip(got, reference)):
                return False
    return True


class Step:
    def __init__(self, fn, obs_dim: int, hidden: int) -> None:
        self.fn, self.obs_dim, self.hidden = fn, obs_dim, hidden

    def __call__(self, obs, state):
        return self.fn(obs, state)

    def state(self, n: int, rng):
        return rng.standard_normal((n, self.hidden)).astype(np.float32) if self.hidden else None


def main() -> None:
    print(f"# numpy {np.__version__}, torch {torch.__version__}; one thread; rows: {' '.join(map(str, ROWS))}")
    for name, (obs_dim, act_dim, options) in NETWORKS.items():
        cfg, model, kernel = network(obs_dim, act_dim, options)
        hidden = cfg.rnn_hidden_size if cfg.policy == "gru" else 0
        steps = {
            "numpy": Step(functools.partial(numpy_outputs, kernel), obs_dim, hidden),
            "torch": Step(functools.partial(torch_outputs, model, cfg), obs_dim, hidden),
        }
        for library, step in steps.items():
            rng = np.random.default_rng(1)
            split = "".join(" =" if split_equal(step, 16, m, rng) else " x" for m in ROWS if m <= 16)
            place = "".join(" =" if place_equal(step, m, rng) else " x" for m in ROWS)
            print(f"{name:30s} {library}: split of 16 into calls of 1-16 rows:{split}; place in a call of m:{place}")


if __name__ == "__main__":
    main()
