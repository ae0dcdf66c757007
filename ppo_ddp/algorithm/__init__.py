"""PPO: generalised advantage estimation (gae), the mini-batch step written once (ppo_step), its compiled form
(compiled) and one rank's update over a round (learner)."""
