"""Benchmark evaluation harnesses: TOFU (scoring pass, metrics, logs and Markdown summaries).

>>> from mmunlearn.eval import evaluate_tofu, summary_table, compare_table  # doctest: +SKIP
>>> logs = evaluate_tofu(adapter, "/data/tofu", forget_split="forget10", out_dir="runs/target")  # doctest: +SKIP
"""

from mmunlearn.eval.scoring import Scores, generate_answers, score_answers, score_candidates
from mmunlearn.eval.splits import EvalSplits, MissingSplitError, holdout_for, load_eval_splits
from mmunlearn.eval.summary import HEADLINE, SUMMARY_MD_FILENAME, compare_table, summary_table, write_summary_md
from mmunlearn.eval.tofu import DEFAULT_MAX_NEW_TOKENS, METRIC_GROUPS, evaluate_tofu

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "EvalSplits",
    "HEADLINE",
    "METRIC_GROUPS",
    "MissingSplitError",
    "SUMMARY_MD_FILENAME",
    "Scores",
    "compare_table",
    "evaluate_tofu",
    "generate_answers",
    "holdout_for",
    "load_eval_splits",
    "score_answers",
    "score_candidates",
    "summary_table",
    "write_summary_md",
]
