"""``python -m recipes.tofu ...``: the ``mmunlearn tofu`` commands where the package is not installed (no entry
points)."""

from recipes.tofu.cli import app

app()
