"""How a text LLM's question-answer rows are written out before they are scored or trained on: the prompt format.

A format is one of :data:`NAMED` or a format string:

* ``chat``: the tokenizer's chat template (a user turn, then the generation prompt), the answer after it;
* ``plain``: ``Question: {question}\\nAnswer: {answer}`` (the answer after one space);
* ``raw``: the question and the answer joined by one space, nothing added (``question + " " + answer``);
* a string holding ``{question}`` once and, after it, ``{answer}`` once (e.g. ``"Q: {question}\\nA: {answer}"``):
  the text before ``{answer}`` is the prompt, the rest (the answer and whatever follows it) is scored.

:func:`split` turns a format into (prompt template, answer template); :func:`check` refuses a malformed one.
"""

from __future__ import annotations

from string import Formatter

#: The named formats (``chat`` needs a tokenizer with a chat template).
NAMED: tuple[str, ...] = ("chat", "plain", "raw")
#: The prompt and answer templates of the named formats other than ``chat``.
TEMPLATES: dict[str, tuple[str, str]] = {
    "plain": ("Question: {question}\nAnswer:", " {answer}"),
    "raw": ("{question}", " {answer}"),
}


def check(fmt: str) -> str:
    """``fmt`` if it is a named format or a format string with ``{question}`` then ``{answer}``, each once and no
    other field; a ``ValueError`` saying what is wrong otherwise."""
    if not isinstance(fmt, str) or not fmt:
        raise ValueError(
            f"prompt_format must be one of {', '.join(NAMED)} or a string with {{question}} and {{answer}}, got {fmt!r}"
        )
    if fmt in NAMED:
        return fmt
    try:
        fields = [name for _, name, _, _ in Formatter().parse(fmt) if name is not None]
    except ValueError as exc:
        raise ValueError(f"prompt_format {fmt!r} is not a valid format string ({exc})") from None
    if fields != ["question", "answer"]:
        raise ValueError(
            f"prompt_format {fmt!r} must name {{question}} once and then {{answer}} once, and no other "
            f"field (found: {', '.join('{' + f + '}' for f in fields) or 'none'}); or one of "
            f"{', '.join(NAMED)}"
        )
    return fmt


def split(fmt: str) -> tuple[str, str]:
    """(prompt template with ``{question}``, answer template with ``{answer}``) of a format other than ``chat``."""
    fmt = check(fmt)
    if fmt == "chat":
        raise ValueError("the chat format is the tokenizer's template, not a format string")
    if fmt in TEMPLATES:
        return TEMPLATES[fmt]
    prompt, answer, into_answer = [], [], False
    for literal, name, spec, conv in Formatter().parse(fmt):
        (answer if into_answer else prompt).append(literal.replace("{", "{{").replace("}", "}}"))
        if name is not None:
            into_answer = into_answer or name == "answer"
            field = name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "")
            (answer if into_answer else prompt).append("{" + field + "}")
    return "".join(prompt), "".join(answer)


__all__ = ["NAMED", "TEMPLATES", "check", "split"]
