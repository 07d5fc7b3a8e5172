"""The ``mmunlearn.bench`` entry point's module (pyproject.toml: ``requests = "recipes.requests_cli:requests"``): the
command lives in recipes/requests/cli.py; this name stays so that an installed package's entry points keep working."""

from recipes.requests.cli import requests

__all__ = ["requests"]
