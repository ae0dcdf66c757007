"""Ranks in step: process-group setup and teardown (process_group), the few collectives PPO needs (collectives),
agreement on stops and failures (agreement), and SIGINT/SIGTERM (signals)."""
