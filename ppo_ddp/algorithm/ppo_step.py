"""The PPO mini-batch step, written once: a function of the flat parameter, Adam's flat state and one mini-batch.

`PPOStep.gradient` is the clipped-PPO loss and its gradient with respect to the flat parameter; `PPOStep.apply`
clips that gradient by its global norm and takes Adam's step, in place. `PPOStep.__call__` is both. The learner
(ppo_ddp/algorithm/learner.py) runs these functions as they are (the eager path, `--no-compile`) or compiled by
ppo_ddp/algorithm/compiled.py, which traces this same code: there is no second copy of the loss or of Adam anywhere.

Why one function of flat tensors: a default step (two 64-64 MLPs on 64 rows) is ~0.1 ms of arithmetic, and eager
PyTorch spends ~5x that dispatching its few hundred small ops one by one. Compiled as one graph (forward, loss,
backward, clip and Adam), inductor fuses them into a handful of kernels (docs/design.md, "the update").
Every shape here is fixed for a run and the learning rate and coefficients are tensors, so nothing recompiles
during a run.
Pure math: nothing here knows of ranks or torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from ppo_ddp.configuration.config import Config
from ppo_ddp.models.mlp import ActorCritic

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-5  # CleanRL's, instead of torch's 1e-8


@dataclass
class Minibatch:
    """One mini-batch of the round (contiguous slices of the epoch's shuffled columns); the advantages negated.

    Rows are samples ([B, ...]) for an MLP, chunks of seq_length steps ([C, L, ...]) for a GRU, which also gets
    the state entering each chunk and the steps that start an episode. The loss is elementwise and a mean over
    every step either way."""

    obs: torch.Tensor
    actions: torch.Tensor
    old_logp: torch.Tensor
    old_values: torch.Tensor
    neg_adv: torch.Tensor
    returns: torch.Tensor
    hidden: Optional[torch.Tensor] = None
    """[C, H]: the GRU states entering each chunk (policy "gru")."""
    episode_start: Optional[torch.Tensor] = None
    """[C, L], 1.0 where the step starts an episode (policy "gru")."""
    critic_obs: Optional[torch.Tensor] = None
    """[B, Dc] or [C, L, Dc]: the critic's own observations (critic_obs)."""
    prox_logp: Optional[torch.Tensor] = None
    """Overlapped rounds: the log-probs under the weights the update started from (the clip's centre); old_logp are
    then the behaviour policy's, one round older."""


class FlatAdam:
    """Adam's state for one flat parameter: the two moments, the step count and the rate, all tensors on the
    learner's device (a tensor rate changes without recompiling the step). `state_dict` has the layout of
    torch.optim.Adam's for one parameter, so checkpoints written before and after this class load in both."""

    def __init__(self, params: torch.Tensor, lr: float) -> None:
        self.exp_avg = torch.zeros_like(params)
        self.exp_avg_sq = torch.zeros_like(params)
        self.step = torch.zeros((), dtype=torch.float32, device=params.device)
        self.lr = torch.tensor(lr, dtype=torch.float32, device=params.device)
        self.lr_value = float(lr)  # the rate as a number, for metrics, without a device sync

    def set_lr(self, lr: float) -> None:
        self.lr.fill_(lr)
        self.lr_value = float(lr)

    def state_dict(self) -> dict[str, Any]:
        state = {"step": self.step.clone(), "exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone()}
        group = {"lr": self.lr_value, "betas": ADAM_BETAS, "eps": ADAM_EPS, "weight_decay": 0, "amsgrad": False}
        return {"state": {0: state}, "param_groups": [{**group, "params": [0]}]}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        state = saved["state"].get(0)  # absent when the optimizer had taken no step yet
        if state is None:
            for t in (self.exp_avg, self.exp_avg_sq, self.step):
                t.zero_()
        else:
            self.exp_avg.copy_(state["exp_avg"])
            self.exp_avg_sq.copy_(state["exp_avg_sq"])
            self.step.copy_(torch.as_tensor(state["step"], dtype=torch.float32))
        self.set_lr(float(saved["param_groups"][0]["lr"]))


class PPOStep:
    """The clipped-PPO step of a config on a model's flat parameter (in model.parameters() order, model.flat_views).

    The model itself is only the forward's structure: it evaluates views of the flat tensor the step is given
    (ActorCritic.evaluate's params), so the step is a function of its inputs alone.
    """

    def __init__(self, cfg: Config, model: ActorCritic) -> None:
        self.model = model
        self.shapes = [p.shape for p in model.parameters()]
        self.sizes = [p.numel() for p in model.parameters()]
        self.clip_vloss = cfg.clip_vloss
        self.bounds_loss = cfg.bounds_loss_coef > 0  # fixed for a run: off, the graph has no such term at all
        # The coefficients as one tensor, an input of the compiled graph rather than constants baked into it:
        # configs that differ only in them (a search's trials, the tests) share one compiled step in the cache.
        device = next(model.parameters()).device
        lag_weight_max = float("inf") if cfg.lag_weight_max is None else cfg.lag_weight_max
        coefs = (cfg.clip_coef, cfg.ent_coef, cfg.vf_coef, cfg.max_grad_norm, cfg.bounds_loss_coef, lag_weight_max)
        self.coefs = torch.tensor(coefs, dtype=torch.float32, device=device)

    def loss(self, params: torch.Tensor, mb: Minibatch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The PPO loss at `params`; also ([pg_loss, v_loss, entropy], log-ratio) for the round's metrics."""
        views = [t.view(shape) for shape, t in zip(self.shapes, params.split(self.sizes))]
        new_logp, entropy, new_value, mean = self.model.evaluate_minibatch(mb, views)
        clip_coef, ent_coef, vf_coef = self.coefs[0], self.coefs[1], self.coefs[2]
        log_ratio = new_logp - (mb.old_logp if mb.prox_logp is None else mb.prox_logp)
        ratio = log_ratio.exp()
        clipped_ratio = ratio.clamp(1 - clip_coef, 1 + clip_coef)
        pg = torch.max(mb.neg_adv * ratio, mb.neg_adv * clipped_ratio)
        if mb.prox_logp is not None:  # off-policy by one round: each sample weighted by pi_prox / pi_behaviour
            pg = pg * torch.minimum((mb.prox_logp - mb.old_logp).exp(), self.coefs[5])
        pg_loss = pg.mean()
        if self.clip_vloss:
            clipped = mb.old_values + (new_value - mb.old_values).clamp(-clip_coef, clip_coef)
            v_loss = 0.5 * torch.max((new_value - mb.returns).pow(2), (clipped - mb.returns).pow(2)).mean()
        else:
            v_loss = 0.5 * (new_value - mb.returns).pow(2).mean()
        loss = pg_loss - ent_coef * entropy + vf_coef * v_loss
        if self.bounds_loss:  # rl_games' bounds loss of type "regularisation": the squared norm of the action mean
            loss = loss + self.coefs[4] * mean.pow(2).sum(-1).mean()
        return loss, (torch.stack([pg_loss, v_loss, entropy]), log_ratio)

    def gradient(self, params: torch.Tensor, mb: Minibatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(flat gradient of the loss, [pg_loss, v_loss, entropy], log-ratio), all detached.

        torch.autograd.grad of a leaf made here rather than torch.func.grad: the same graph once compiled, and
        half the eager cost (functorch's transform wraps every op of an eager run)."""
        with torch.enable_grad():
            leaf = params.detach().requires_grad_(True)
            loss, (stats, log_ratio) = self.loss(leaf, mb)
            (grad,) = torch.autograd.grad(loss, leaf)
        return grad, stats.detach(), log_ratio.detach()

    @torch.no_grad()
    def apply(self, params: torch.Tensor, grad: torch.Tensor, adam: FlatAdam) -> None:
        """Clip the gradient to max_grad_norm (clip_grad_norm_ over all parameters) and take Adam's step in place:
        torch.optim.Adam's arithmetic, written out for one flat tensor so that it compiles into the same graph."""
        beta1, beta2 = ADAM_BETAS
        grad = grad * (self.coefs[3] / (torch.linalg.vector_norm(grad) + 1e-6)).clamp(max=1.0)
        adam.step.add_(1)
        adam.exp_avg.lerp_(grad, 1 - beta1)
        adam.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = adam.lr / (1 - beta1**adam.step)
        denom = (adam.exp_avg_sq.sqrt() / (1 - beta2**adam.step).sqrt()).add_(ADAM_EPS)
        params.sub_(step_size * adam.exp_avg / denom)

    def __call__(self, params: torch.Tensor, adam: FlatAdam, mb: Minibatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole step of one rank alone: gradient, clip, Adam. Returns ([pg_loss, v_loss, entropy], log-ratio)."""
        grad, stats, log_ratio = self.gradient(params, mb)
        self.apply(params, grad, adam)
        return stats, log_ratio
