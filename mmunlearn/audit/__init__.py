"""Robustness audits of unlearned models: does the forgetting survive relearning, quantisation, probing and
paraphrase? One module per attack (:mod:`~mmunlearn.audit.relearn`, :mod:`~mmunlearn.audit.quantise`,
:mod:`~mmunlearn.audit.probe`, :mod:`~mmunlearn.audit.paraphrase`), the measures they share
(:mod:`~mmunlearn.audit.measures`), the runner (:mod:`~mmunlearn.audit.runner`: ``audit_text``,
``audit_speaker``) and its table and files (:mod:`~mmunlearn.audit.table`: AUDIT.json / AUDIT.md);
:mod:`~mmunlearn.audit.folder` audits a harness output folder."""

from mmunlearn.audit.options import ATTACKS, AuditOptions
from mmunlearn.audit.runner import audit_speaker, audit_text
from mmunlearn.audit.table import AUDIT_JSON, AUDIT_MD, markdown, write_audit

__all__ = [
    "ATTACKS",
    "AUDIT_JSON",
    "AUDIT_MD",
    "AuditOptions",
    "audit_speaker",
    "audit_text",
    "markdown",
    "write_audit",
]
