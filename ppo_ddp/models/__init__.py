"""The networks and their statistics: running moments (normalization), the Gaussian MLP actor-critic (mlp), the GRU
one (gru), the flat parameter views the shared memory and the update use (flat), the policy an actor steps in numpy
(kernels), the choice between them (factory) and the env's action from a sample (actions)."""
