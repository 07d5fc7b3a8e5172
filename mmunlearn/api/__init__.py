"""The unlearning request flow behind the package face: ``mmunlearn.unlearn`` (unlearn.py: a model folder of any
kind, its forget and retain sets, the kind's rule, the harness), the sets read and checked (inputs.py), the default
rules and the "nothing to forget" check (rules.py; a text LLM's rule judged row by row: row_rule.py), a text LLM's
prompt format and stage lines (text.py), a classifier's scopes (scopes.py), ``mmunlearn.load`` (load.py) and
``mmunlearn restore`` (restore.py).

Import the submodules directly (``from mmunlearn.api.unlearn import unlearn``); this package imports nothing.
"""
