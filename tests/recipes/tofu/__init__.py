"""The TOFU benchmark (recipes/tofu/) end to end on the micro preset: options, parallel stages, tables; and
examples/tofu_goals.py."""
