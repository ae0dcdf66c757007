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

    next_obs: torch.Tensor  # rows [B, Dv] (the critic's observation), in the batch's row order (env, step)
    rewards: torch.Tensor  # [T, N]: scaled as the actors scaled them (the round's frozen return statistics)
    terminated: torch.Tensor  # [T, N], bool
    truncated: torch.Tensor

    def grid(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows [N * T] (env, step) as the [T, N] grid."""
        return rows.reshape(-1, self.rewards.shape[0]).movedim(1, 0)

    def rows(self, grid: torch.Tensor) -> torch.Tensor:
        """The [T, N] grid as rows [N * T]: the inverse of grid()."""
        return grid.movedim(0, 1).reshape(-1)


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
        """The [A, T, E, ...] shared rollout as rows, env by env: the rows of env n = a * E + e (the env's index in
        the rank's round) are its steps in order, so a round's rows are the same however its envs were split over
        actors (ppo_ddp/sampling/split.py). Copied to the device first (non_blocking when the buffers are pinned),
        then reordered there. Chunks (a GRU's rows): chunk (n, c) holds steps c*L .. c*L+L-1 of env n, whose
        entering state is hidden[a, c, e]; ranks and envs never share a chunk. With next observations in the layout,
        the RoundSteps for recomputing the advantages (rewards scaled with reward_clip, as the actors did)."""
        L = buffers.spec.seq_length if buffers.spec.rnn_hidden else None

        def rows(t: torch.Tensor, trailing: int) -> torch.Tensor:
            t = t.to(device, non_blocking=True).movedim(2, 1)  # [A, T, E, ...] -> [A, E, T, ...]
            if L is None:  # -> [A * E * T, ...]
                return t.reshape(-1, *t.shape[t.dim() - trailing :]) if trailing else t.reshape(-1)
            return t.reshape(-1, L, *t.shape[3:])  # -> [A * E * T/L, L, ...]

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

            def grid(t: torch.Tensor) -> torch.Tensor:  # [A, T, E] -> [T, A * E] = [T, N]
                return t.movedim(1, 0).reshape(t.shape[1], -1).to(device, non_blocking=True)

            ret_rms = buffers.read_stats().ret  # the frozen statistics the actors scaled this round's rewards with
            rewards = torch.from_numpy(scale_reward(buffers.arrays["rewards"], ret_rms, reward_clip))
            batch.steps = RoundSteps(
                rows(buffers.next_obs, 1),
                grid(rewards),
                grid(buffers.terminated.bool()),
                grid(buffers.truncated.bool()),
            )
        return batch
