"""Envs: the one place that makes gymnasium envs (make), the partly observed robots (partial), an actor's envs stepped
as one group (group) and their exact captured state (state), videos of episodes (video)."""
