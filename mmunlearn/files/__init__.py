"""Files written safely: atomic writes and output folders (atomic.py, checkpoint.py), path rules for untrusted
folders (paths.py), the names outputs use (layout.py), side files copied without following links (safecopy.py), what
may hold the original weights (held_weights.py), undo records kept apart (undo_store.py) and parameter names as a
saved folder spells them (ondisk.py).

This package imports only the root modules (errors, kinds, _version): every layer writes through it. Import the
submodules directly (``mmunlearn.files.atomic``, ...).
"""
