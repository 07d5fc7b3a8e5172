"""The cross-lingual TOFU benchmark (recipes/ctofu/) and examples/ctofu_goals.py."""
