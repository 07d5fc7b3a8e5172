"""TOFU metric suite as pure functions on per-item scores (NLLs, log-probs, texts), plus the log files.

No model code here: callers compute per-item answer NLLs, token log-probs and generations, and
these functions turn them into TOFU's numbers with open-unlearning's definitions and key names.

>>> from mmunlearn.metrics import truth_ratio, truth_ratio_closer_to_1
>>> round(truth_ratio_closer_to_1(truth_ratio([1.0, 2.0], [[2.0, 2.0], [1.0, 1.0]])), 4)
0.3679
"""

from mmunlearn.metrics.entries import (
    agg_entry,
    mia_entry,
    normalised_prob_entry,
    per_item,
    prob_entry,
    rouge_entry,
    score_entry,
    truth_ratio_entry,
)
from mmunlearn.metrics.keys import (
    ALL_KEYS,
    MODEL_UTILITY_KEYS,
    MODEL_UTILITY_ROUGE_KEYS,
    PROJECT_KEYS,
    REFERENCE_KEYS,
)
from mmunlearn.metrics.logs import (
    EVAL_FILENAME,
    SUMMARY_FILENAME,
    read_tofu_logs,
    retain_agg_value,
    retain_forget_truth_ratios,
    summarize,
    write_json_atomic,
    write_tofu_logs,
)
from mmunlearn.metrics.memorization import exact_memorization, extraction_strength, token_matches
from mmunlearn.metrics.mia import (
    MIN_K,
    PRIVLEAK_DEFAULT_RETAIN_AUC,
    loss_scores,
    mia_auc,
    min_k_plus_plus_scores,
    min_k_scores,
    privleak,
    vocab_logprob_moments,
    zlib_scores,
)
from mmunlearn.metrics.rouge import ROUGE_FIELDS, rouge_l_recall, rouge_scores
from mmunlearn.metrics.tofu import (
    TRUTH_RATIO_AGGREGATORS,
    forget_quality,
    harmonic_mean,
    model_utility,
    model_utility_rouge,
    normalised_prob,
    prob_from_nll,
    qa_prob,
    truth_ratio,
    truth_ratio_closer_to_1,
    truth_ratio_share,
    truth_ratio_true_better,
)

__all__ = [
    "ALL_KEYS",
    "EVAL_FILENAME",
    "MIN_K",
    "MODEL_UTILITY_KEYS",
    "MODEL_UTILITY_ROUGE_KEYS",
    "PRIVLEAK_DEFAULT_RETAIN_AUC",
    "PROJECT_KEYS",
    "REFERENCE_KEYS",
    "ROUGE_FIELDS",
    "SUMMARY_FILENAME",
    "TRUTH_RATIO_AGGREGATORS",
    "agg_entry",
    "exact_memorization",
    "extraction_strength",
    "forget_quality",
    "harmonic_mean",
    "loss_scores",
    "mia_auc",
    "mia_entry",
    "min_k_plus_plus_scores",
    "min_k_scores",
    "model_utility",
    "model_utility_rouge",
    "normalised_prob",
    "normalised_prob_entry",
    "per_item",
    "prob_entry",
    "prob_from_nll",
    "privleak",
    "qa_prob",
    "read_tofu_logs",
    "retain_agg_value",
    "retain_forget_truth_ratios",
    "rouge_entry",
    "rouge_l_recall",
    "rouge_scores",
    "score_entry",
    "summarize",
    "token_matches",
    "truth_ratio",
    "truth_ratio_closer_to_1",
    "truth_ratio_share",
    "truth_ratio_entry",
    "truth_ratio_true_better",
    "vocab_logprob_moments",
    "write_json_atomic",
    "write_tofu_logs",
    "zlib_scores",
]
