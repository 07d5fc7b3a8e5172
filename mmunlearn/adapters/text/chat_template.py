"""Chat templates rendered within bounds: a tokenizer's Jinja template is someone else's code, run by transformers in
Jinja's sandbox, which stops attribute tricks but not a template that writes gigabytes (``'x' * 10**10``, nested
loops): :func:`install` makes transformers compile templates in :class:`BoundedEnvironment`, whose templates stop at
:data:`MAX_RENDERED` characters and refuse a repetition or power that would exceed it, with Jinja's ``SecurityError``.
:func:`template_error` turns what a template raises into one error naming the tokenizer's folder.
"""

from __future__ import annotations

from typing import Any

from jinja2 import Template
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

#: Most characters one rendered prompt may have (a chat prompt is a few kB; TOFU's longest is under 2 kB)
MAX_RENDERED = 1 << 20


class BoundedTemplate(Template):
    """A template whose :meth:`render` stops at :data:`MAX_RENDERED` characters."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        pieces, size = [], 0
        for piece in self.generate(*args, **kwargs):
            size += len(piece)
            if size > MAX_RENDERED:
                raise SecurityError(f"the chat template renders more than {MAX_RENDERED:,} characters")
            pieces.append(piece)
        return "".join(pieces)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' sandbox, with :class:`BoundedTemplate` and ``*`` / ``**`` checked before they run."""

    template_class = BoundedTemplate
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_RENDERED:
                    raise SecurityError(
                        f"the chat template repeats a sequence {n:,} times: more than {MAX_RENDERED:,} items"
                    )
        if (
            operator == "**"
            and all(isinstance(v, (int, float)) for v in (left, right))
            and abs(left) > 1
            and abs(right) > 256
        ):
            raise SecurityError(f"the chat template raises a number to the power {right!r}")
        return super().call_binop(context, operator, left, right)


def install() -> None:
    """Make transformers compile chat templates in :class:`BoundedEnvironment` (once; templates it compiled before
    are compiled again). Does nothing where transformers builds its sandbox differently."""
    from transformers.utils import chat_template_utils as ctu  # deferred: transformers is heavy to import

    if getattr(ctu, "ImmutableSandboxedEnvironment", BoundedEnvironment) is not ImmutableSandboxedEnvironment:
        return
    ctu.ImmutableSandboxedEnvironment = BoundedEnvironment
    clear = getattr(getattr(ctu, "_compile_jinja_template", None), "cache_clear", None)
    if clear is not None:
        clear()


def template_error(exc: Exception, source: object) -> ValueError:
    """A one-line error naming the tokenizer ``source`` whose chat template raised ``exc``."""
    text = " ".join(str(exc).split())[:300] or type(exc).__name__
    return ValueError(f"{source}: the tokenizer's chat template failed ({type(exc).__name__}: {text})")


__all__ = ["MAX_RENDERED", "BoundedEnvironment", "BoundedTemplate", "install", "template_error"]
