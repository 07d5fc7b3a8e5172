"""The TOFU benchmark (``mmunlearn tofu ...``): its commands (cli.py), its settings as one config (config.py), its
steps: models built and cached, evaluation (pipeline.py), method options and sweep rules (settings.py), parallel
stages (parallel.py) and its tables and plots (report.py).

``recipes.tofu:app`` (the ``mmunlearn.recipes`` entry point) is read through this package on first use, so that
importing one of its modules (``recipes.tofu.config``) does not build the command line.
"""


def __getattr__(name: str):
    if name == "app":
        from recipes.tofu.cli import app  # deferred: built when read, not when a submodule is imported

        return app
    raise AttributeError(f"module 'recipes.tofu' has no attribute {name!r}")
