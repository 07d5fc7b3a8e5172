"""The cross-lingual TOFU benchmark (``mmunlearn ctofu ...``): its commands (cli.py), its settings as one config
(config.py), its steps (pipeline.py) and its tables (report.py).

``recipes.ctofu:app`` (the ``mmunlearn.recipes`` entry point) is read through this package on first use, so that
importing one of its modules (``recipes.ctofu.config``) does not build the command line.
"""


def __getattr__(name: str):
    if name == "app":
        from recipes.ctofu.cli import app  # deferred: built when read, not when a submodule is imported

        return app
    raise AttributeError(f"module 'recipes.ctofu' has no attribute {name!r}")
