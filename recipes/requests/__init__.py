"""``mmunlearn bench requests``: deletion requests benchmarked on a speaker classifier (speaker.py) and a TOFU model
(tofu.py), its command in cli.py (mounted into ``mmunlearn bench`` through the ``mmunlearn.bench`` entry point,
recipes/requests_cli.py)."""
