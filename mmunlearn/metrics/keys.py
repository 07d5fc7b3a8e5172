"""Metric key names of the TOFU logs, spelled exactly as open-unlearning's TOFU evaluator writes them.

Checked against locuslab/open-unlearning ``configs/eval/tofu.yaml`` and
``configs/eval/tofu_metrics/*.yaml`` (the ``# @package eval.tofu.metrics.<key>`` line of each).
Note the inconsistent case the reference uses: ``forget_truth_ratio`` is lower-case while
``retain_Truth_Ratio``, ``ra_Truth_Ratio`` and ``wf_Truth_Ratio`` are capitalised.

The reference puts every metric it computes into ``TOFU_EVAL.json`` at the top level, including
the ones computed only as inputs of others (e.g. ``ra_Q_A_Prob`` feeds ``ra_Truth_Ratio`` and
``ra_Q_A_Prob_normalised``), so all of them are listed here.
"""

from __future__ import annotations

# --- forget set (forgetXX / forgetXX_perturbed) ---
FORGET_KEYS = (
    "forget_Q_A_Prob",  # prob of `answer`
    "forget_Q_A_PARA_Prob",  # prob of `paraphrased_answer`
    "forget_Q_A_PERT_Prob",  # probs of each `perturbed_answer`
    "forget_Q_A_ROUGE",  # ROUGE-L recall of generations vs `answer`
    "forget_Q_A_PARA_ROUGE",  # ... asked with `paraphrased_question`
    "forget_Q_A_PERT_ROUGE",  # ... vs perturbed answers
    "forget_truth_ratio",  # per-item R, aggregate closer_to_1_better
    "forget_quality",  # KS p-value vs the retain model's forget_truth_ratio
)

# --- retain set (retain_perturbed, the first 400 retain items) ---
RETAIN_KEYS = (
    "retain_Q_A_Prob",
    "retain_Q_A_PARA_Prob",
    "retain_Q_A_PERT_Prob",
    "retain_Q_A_ROUGE",
    "retain_Q_A_PARA_ROUGE",
    "retain_Q_A_PERT_ROUGE",
    "retain_Truth_Ratio",  # correct = paraphrased_answer, aggregate true_better
)

# --- real authors (ra) and world facts (wf) ---
RA_KEYS = (
    "ra_Q_A_Prob",
    "ra_Q_A_PERT_Prob",
    "ra_Q_A_Prob_normalised",
    "ra_Q_A_ROUGE",
    "ra_Truth_Ratio",  # correct = answer, aggregate true_better
)
WF_KEYS = (
    "wf_Q_A_Prob",
    "wf_Q_A_PERT_Prob",
    "wf_Q_A_Prob_normalised",
    "wf_Q_A_ROUGE",
    "wf_Truth_Ratio",
)

# --- aggregates, memorisation, privacy ---
OTHER_KEYS = (
    "model_utility",
    "extraction_strength",
    "exact_memorization",
    "mia_loss",
    "mia_zlib",
    "mia_min_k",
    "mia_min_k_plus_plus",
    "mia_gradnorm",  # the reference's; not computed by mmunlearn.metrics (needs gradients)
    "mia_reference",  # the reference's; needs a reference model's scores
    "privleak",  # from mia_min_k AUCs, relative to the retain model's
)

REFERENCE_KEYS: tuple[str, ...] = FORGET_KEYS + RETAIN_KEYS + RA_KEYS + WF_KEYS + OTHER_KEYS

# mmunlearn's own additions (not in the reference evaluator).
PROJECT_KEYS: tuple[str, ...] = ("model_utility_rouge",)  # hmean of the three ROUGE-L scores

ALL_KEYS: tuple[str, ...] = REFERENCE_KEYS + PROJECT_KEYS

# The nine aggregates whose harmonic mean is model utility (reference: model_utility.yaml).
MODEL_UTILITY_KEYS: tuple[str, ...] = (
    "retain_Q_A_Prob",
    "retain_Q_A_ROUGE",
    "retain_Truth_Ratio",
    "ra_Q_A_Prob_normalised",
    "ra_Q_A_ROUGE",
    "ra_Truth_Ratio",
    "wf_Q_A_Prob_normalised",
    "wf_Q_A_ROUGE",
    "wf_Truth_Ratio",
)
MODEL_UTILITY_ROUGE_KEYS: tuple[str, ...] = ("retain_Q_A_ROUGE", "ra_Q_A_ROUGE", "wf_Q_A_ROUGE")

# What forget_quality and privleak read from the retain model's TOFU_EVAL.json
# (reference: ``reference_logs.retain_model_logs.include`` in forget_quality.yaml / privleak.yaml).
RETAIN_LOGS_TRUTH_RATIO_KEY = "forget_truth_ratio"
RETAIN_LOGS_PRIVLEAK_KEY = "mia_min_k"
