"""A run's configuration: the Config and its validation (config), where it comes from (loading: a preset or a YAML
file, then flags or the API's fields), the flags through tyro (flags), the presets (presets), and how many learners
and actors run where (topology)."""
