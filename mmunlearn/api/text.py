"""What ``mmunlearn.unlearn`` settles for a text LLM before any edit: the prompt format its rows are scored and trained
in, and the progress lines a call prints (one per stage, with the elapsed time and an estimate of what remains).

:func:`choose_format`: the format given (``prompt_format=``), else the tokenizer's chat template when it has one, else
the candidate (:data:`CANDIDATES`) under which the model's forget rows have the lowest mean answer NLL -- the format
the model was most likely trained in; the choice and why go into the report.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from mmunlearn.methods import mean_nll
from mmunlearn.methods.rule import span

#: The formats tried, in order, for a tokenizer without a chat template (mmunlearn.adapters.text.prompt_format).
CANDIDATES: tuple[str, ...] = ("plain", "raw")


def choose_format(adapter, forget: Sequence[Any], given: str | None, which: str = "forget") -> dict[str, Any]:
    """Set ``adapter``'s prompt format and say which and why: ``{"format", "chosen_by", "forget_nll"}`` (the mean
    NLL of the rows under each candidate tried, when none was given and the tokenizer has no chat template).
    ``which``: what the rows are, as the choice names them (``prepare_retain`` chooses on the retain rows: it has
    no forget rows; the key is then ``retain_nll``)."""
    if given is not None:
        adapter.set_prompt_format(given)
        return {"format": adapter.format_name, "chosen_by": "given (prompt_format=)"}
    if adapter.format_name == "chat":
        return {"format": "chat", "chosen_by": "the tokenizer's chat template (with its default system prompt)"}
    rows = [r for r in forget if r.get("question")]  # prompt-less text is scored as it is, in every format
    if not rows:
        return {"format": adapter.format_name, "chosen_by": "no question-answer rows (prompt-less text only)"}
    scores = {}
    for fmt in CANDIDATES:
        adapter.set_prompt_format(fmt)
        scores[fmt] = mean_nll(adapter, rows)
    best = min(scores, key=scores.get)
    adapter.set_prompt_format(best)
    return {
        "format": best,
        f"{which}_nll": scores,
        "chosen_by": f"no chat template: the lowest {which} NLL of {', '.join(CANDIDATES)}",
    }


class Clock:
    """One line per finished stage of a call (to stderr): the stage's seconds, the elapsed time and what is left."""

    def __init__(self, total: int, on: bool = True, say: Callable[[str], Any] | None = None):
        self.total, self.on, self.start, self.done_count = total, on, time.perf_counter(), 0
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.last = self.start

    def since(self) -> float:
        """Seconds since the last stage finished (or the start)."""
        return time.perf_counter() - self.last

    def done(self, name: str, left: str) -> float:
        """Say that stage ``name`` finished; ``left``: what remains, in words, with an estimate of its time where one
        can be made. Returns the stage's seconds."""
        now = time.perf_counter()
        took, self.last = now - self.last, now
        self.done_count += 1
        if self.on:
            self.say(
                f"[mmunlearn {self.done_count}/{self.total}] {name}: {span(took)}; elapsed "
                f"{span(now - self.start)}; left: {left}"
            )
        return took


__all__ = ["CANDIDATES", "Clock", "choose_format"]
