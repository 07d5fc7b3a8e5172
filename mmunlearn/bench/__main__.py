"""Entry point of ``python -m mmunlearn.bench``."""

import mmunlearn  # noqa: F401  (torchaudio compatibility before anything else)
from mmunlearn.bench.cli import app

app()
