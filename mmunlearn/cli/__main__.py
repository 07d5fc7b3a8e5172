"""``python -m mmunlearn.cli ...`` (e.g. under ``accelerate launch -m mmunlearn.cli``): the ``mmunlearn`` command."""

from mmunlearn.cli import main

main()
