"""The actors: one actor's envs and rollouts (actor), the process it runs in (process), the learner's pool of them
(pool), how child processes start and how their failures read (children), and whether a round fits the node
(capacity)."""
