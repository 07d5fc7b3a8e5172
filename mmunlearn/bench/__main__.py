"""Entry point of ``python -m mmunlearn.bench``."""

# ``python -m`` imports the package face (mmunlearn/__init__.py: torchaudio compatibility) before this module
from mmunlearn.bench.cli import app

app()
