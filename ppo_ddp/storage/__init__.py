"""What is written once and read by others: the shared-memory block between a learner and its actors (shared), a
round's rollout as the learner's tensors (batch), and checkpoint files (checkpoint)."""
