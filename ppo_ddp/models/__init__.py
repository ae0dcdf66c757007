"""The networks and their statistics: running moments (normalization), the MLP actor-critic (mlp), the GRU one
(gru), their action distributions (distributions), the flat parameter views the shared memory and the update use
(flat), the policy an actor steps in numpy (kernels), the choice between them (factory) and an actor's draw of its
actions (actions)."""
