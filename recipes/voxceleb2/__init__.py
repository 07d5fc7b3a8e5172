"""The speaker benchmark (``mmunlearn voxceleb2 ...``): its commands (cli.py), its settings as one config (config.py),
method options and sweep rules (settings.py), the classifier path's steps (pipeline.py), the speech-LLM path
(speech_llm.py) and its tables (report.py).

``recipes.voxceleb2:app`` (the ``mmunlearn.recipes`` entry point) is read through this package on first use, so that
importing one of its modules (``recipes.voxceleb2.config``) does not build the command line.
"""


def __getattr__(name: str):
    if name == "app":
        from recipes.voxceleb2.cli import app  # deferred: built when read, not when a submodule is imported

        return app
    raise AttributeError(f"module 'recipes.voxceleb2' has no attribute {name!r}")
