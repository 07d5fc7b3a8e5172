"""How often greedy forget answers restate the author's name the question gives, from TOFU_EVAL.json logs.

Of the forget questions naming their author (a capitalised run of two or more words found in at least ``--min``
forget questions: the forget authors' full names), the share of ``forget_Q_A_ROUGE`` generations containing that
name as the question spells it. One line per log; with ``--json`` the counts as the object a record's context holds::

    python examples/tofu/name_restated.py runs/x/t3/TOFU_EVAL.json RETAIN_MODEL/evals/<key>/TOFU_EVAL.json
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

NAME = re.compile(r"[A-Z][\w'-]+(?: [A-Z][\w'-]+)+")


def rows(log: Path) -> list[dict]:
    """The forget ROUGE-L rows (question, ground truth, generation) of one TOFU_EVAL.json."""
    values = json.loads(log.read_text())["forget_Q_A_ROUGE"]["value_by_index"]
    return list(values.values() if isinstance(values, dict) else (v for _, v in values))


def author_names(questions: list[str], least: int) -> list[str]:
    """The capitalised multi-word runs (a possessive 's dropped) found in at least ``least`` questions, the most
    frequent first: a question naming its author and another phrase ("African American") is given the author."""
    counts = Counter(name for q in questions for name in {n.removesuffix("'s") for n in NAME.findall(q)})
    return sorted((n for n, c in counts.items() if c >= least), key=lambda n: -counts[n])


def restated(log: Path, least: int) -> tuple[int, int]:
    """(answers restating the name, questions naming an author) in one log."""
    items = rows(log)
    names = author_names([r["input"] for r in items], least)
    named = [(r, next(n for n in names if n in r["input"])) for r in items if any(n in r["input"] for n in names)]
    return sum(name in r["generation"] for r, name in named), len(named)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="TOFU_EVAL.json files (a method's, the retain model's)")
    parser.add_argument("--min", type=int, default=5, help="A name counts when found in at least this many questions.")
    parser.add_argument("--labels", default=None, help="Comma-separated labels for the logs (default: their folders).")
    args = parser.parse_args()
    labels = args.labels.split(",") if args.labels else [log.parent.name for log in args.logs]
    if len(labels) != len(args.logs):
        parser.error(f"--labels names {len(labels)} logs, {len(args.logs)} were given")
    out = {}
    for label, log in zip(labels, args.logs):
        said, named = restated(log, args.min)
        out[label] = f"{said} of {named}"
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
