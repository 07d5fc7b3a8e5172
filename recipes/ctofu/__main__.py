"""``python -m recipes.ctofu ...``: the ``mmunlearn ctofu`` commands where the package is not installed (no entry
points)."""

from recipes.ctofu.cli import app

app()
