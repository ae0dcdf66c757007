"""Hyperparameter search with Optuna, the library of python -m ppo_ddp.tune: the search space (space), one trial
(trial), the study and its workers (study) and what is written about it (report)."""
