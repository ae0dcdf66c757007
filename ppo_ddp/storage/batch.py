"""A round's samples as the learner's tensors: the rollout batch a pool hands its learner (rows of samples, or chunks of
steps for a GRU) and the steps that recomputing the advantages reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ppo_ddp.models.normalization import scale_reward


@dataclass
class RoundSteps:
    """What recomputing the advantages needs besides the rows' observations (cfg.recompute_advantages): each
    step's next observation as the critic reads it, as rows, and the GAE inputs the actors had, on the [T, A * E]
    grid of compute_gae."""

    next_obs: torch.Tensor  # rows [B, Dv] (the critic's observation), in the batch's row order (actor, step, env)
    rewards: torch.Tensor  # [T, A * E]: scaled as the actors scaled them (the round's frozen return statistics)
    terminated: torch.Tensor  # [T, A * E], bool
    truncated: torch.Tensor
    num_actors: int

    def grid(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows [A * T * E] (actor, step, env) as the [T, A * E] grid."""
        T = self.rewards.shape[0]
        return rows.reshape(self.num_actors, T, -1).movedim(1, 0).reshape(T, -1)

    def rows(self, grid: torch.Tensor) -> torch.Tensor:
        """The [T, A * E] grid as rows [A * T * E]: the inverse of grid()."""
        return grid.reshape(grid.shape[0], self.num_actors, -1).movedim(0, 1).reshape(-1)


@dataclass
class RolloutBatch:
    """One round's samples of this rank on the learner's device: rows of samples [B, ...] for an MLP, or rows of
    chunks [C, L, ...] of seq_length consecutive steps of one env for a GRU, with the state entering each chunk."""

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    hidden: Optional[torch.Tensor] = None
    episode_start: Optional[torch.Tensor] = None
    critic_obs: Optional[torch.Tensor] = None
    """The critic's own observations (cfg.critic_obs), rows as obs."""
    steps: Optional[RoundSteps] = None

    @property
    def critic_input(self) -> torch.Tensor:
        """What the critic values: its own observations, else the policy's."""
        return self.obs if self.critic_obs is None else self.critic_obs

    def __len__(self) -> int:
        """Rows: what the epochs shuffle and the mini-batches split."""
        return self.obs.shape[0]

    @staticmethod
    def from_buffers(buffers, device: torch.device, reward_clip: float = 10.0) -> RolloutBatch:
        """The [A, T, E, ...] shared rollout as rows; non_blocking copies when the buffers are pinned. Chunks (a GRU's
        rows) are env by env: chunk (a, e, c) holds steps c*L .. c*L+L-1 of env e of actor a, whose entering state
        is hidden[a, c, e]; ranks and actors never share a chunk. With next observations in the layout, the
        RoundSteps for recomputing the advantages (rewards scaled with reward_clip, as the actors did)."""
        L = buffers.spec.seq_length if buffers.spec.rnn_hidden else None

        def rows(t: torch.Tensor, trailing: int) -> torch.Tensor:
            if L is None:
                t = t.reshape(-1, *t.shape[t.dim() - trailing :]) if trailing else t.reshape(-1)
            else:  # [A, T, E, ...] -> [A, E, T, ...] -> [A * E * T/L, L, ...]
                t = t.movedim(2, 1)
                t = t.reshape(-1, L, *t.shape[3:])
            return t.to(device, non_blocking=True)

        batch = RolloutBatch(
            obs=rows(buffers.obs, 1),
            actions=rows(buffers.actions, 1),
            logp=rows(buffers.logp, 0),
            values=rows(buffers.values, 0),
            advantages=rows(buffers.advantages, 0),
            returns=rows(buffers.returns, 0),
        )
        if buffers.spec.critic_dim:
            batch.critic_obs = rows(buffers.critic_obs, 1)
        if L is not None:
            batch.episode_start = rows(buffers.episode_start, 0).float()
            hidden = buffers.hidden.movedim(2, 1)  # [A, T/L, E, H] -> [A, E, T/L, H]: the chunks' order
            batch.hidden = hidden.reshape(-1, *hidden.shape[3:]).to(device, non_blocking=True)
        if buffers.spec.next_obs:

            def grid(t: torch.Tensor) -> torch.Tensor:  # [A, T, E] -> [T, A * E]
                return t.movedim(1, 0).reshape(t.shape[1], -1).to(device, non_blocking=True)

            ret_rms = buffers.read_stats().ret  # the frozen statistics the actors scaled this round's rewards with
            rewards = torch.from_numpy(scale_reward(buffers.arrays["rewards"], ret_rms, reward_clip))
            batch.steps = RoundSteps(
                rows(buffers.next_obs, 1),
                grid(rewards),
                grid(buffers.terminated.bool()),
                grid(buffers.truncated.bool()),
                buffers.spec.num_actors,
            )
        return batch
