"""Policies played on their envs: the policy as its env sees it (policy), episodes of a checkpoint's policy
(playback), and rank 0's evaluator process while training (evaluator)."""
