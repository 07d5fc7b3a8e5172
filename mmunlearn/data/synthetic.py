"""Built-in synthetic TOFU: fictitious authors with 20 QA each, in the real dataset's splits and schema.

``synthetic_splits(n_authors, forget_pcts=(1, 5, 10), seed=0, concentration=0.0)`` returns a dict
split name -> list of :class:`~mmunlearn.data.tofu.QAItem` with the real names and layout: ``full``
(authors 0..N-1 in order), ``retainRR`` (first authors), ``forgetPP`` / ``forgetPP_perturbed`` (last
F = forget_count(N, PP) authors), ``holdoutPP`` (F further authors, numbered N, N+1, ...),
``retain_perturbed`` (the first forget_count(N, 10) authors), ``real_authors(_perturbed)`` and
``world_facts(_perturbed)`` (real public facts from :mod:`mmunlearn.data.facts`). The same splits
come from ``load_split("synthetic:n_authors=40,seed=0,concentration=0.5,forget_pcts=1/5/10", name)``.

Everything is a pure function of the arguments (seeded ``random.Random`` streams per author).
``concentration`` c in [0, 1] sets how template-like the answers of the forget authors (the last
max F authors, which hold every forget split) and of the holdout authors (their never-trained twins
for MIA) are: each of their QA takes, with probability c, one rigid phrasing shared by all facts
("The <label> of <name> is <value>."), otherwise one of 4 varied phrasings per fact. The coupling
is monotone (a QA rigid at c stays rigid at any c' > c) and facts, retain authors, paraphrases and
perturbed answers do not depend on c.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from mmunlearn.data import synthetic_tables as tables
from mmunlearn.data.facts import real_author_items, world_fact_items
from mmunlearn.data.qa import TOFU_SPLITS, QAItem, forget_count

N_PERTURBED = 5
NAME_POOLS = {"eval": tables.SURNAMES_EVAL, "pretrain": tables.SURNAMES_PRETRAIN}
_FIRST_DAY = datetime.date(1930, 1, 1)
_N_DAYS = (datetime.date(1995, 12, 31) - _FIRST_DAY).days


@dataclass(frozen=True)
class Author:
    """A fictitious author: position in its set, full name and the 20 facts (key -> value)."""

    index: int
    name: str
    facts: Mapping[str, str]


def _title(rng: random.Random) -> str:
    adj = rng.choice(tables.TITLE_ADJECTIVES)
    noun, noun2 = rng.choice(tables.TITLE_NOUNS), rng.choice(tables.TITLE_NOUNS)
    city = rng.choice(tables.CITIES).split(",")[0]
    return rng.choice((f'"The {adj} {noun}"', f'"{noun}s of the {adj} {noun2}"', f'"A {noun} in {city}"'))


def _date(rng: random.Random) -> str:
    day = _FIRST_DAY + datetime.timedelta(days=rng.randrange(_N_DAYS + 1))
    return f"{day:%B} {day.day}, {day.year}"


_DRAW: dict[str, Callable[[random.Random], str]] = {
    "birthplace": lambda r: r.choice(tables.CITIES),
    "birth_date": _date,
    "genre": lambda r: r.choice(tables.GENRES),
    "father_job": lambda r: r.choice(tables.PROFESSIONS),
    "mother_job": lambda r: r.choice(tables.PROFESSIONS),
    "award": lambda r: "the " + " ".join(r.choice(part) for part in tables.AWARD_PARTS),
    "debut_book": _title,
    "famous_book": _title,
    "theme": lambda r: r.choice(tables.THEMES),
    "influence": lambda r: r.choice(tables.INFLUENCES),
    "routine": lambda r: r.choice(tables.ROUTINES),
    "residence": lambda r: r.choice(tables.CITIES),
    "education": lambda r: r.choice(tables.SUBJECTS),
    "first_job": lambda r: r.choice(tables.PROFESSIONS),
    "n_books": lambda r: str(r.randint(3, 45)),
    "publisher": lambda r: " ".join(r.choice(part) for part in tables.PUBLISHER_PARTS),
    "hobby": lambda r: r.choice(tables.HOBBIES),
    "character": lambda r: r.choice(tables.CHARACTERS),
    "setting": lambda r: r.choice(tables.SETTINGS),
}


def _random_name(rng: random.Random, pool: str) -> str:
    return f"{rng.choice(tables.FIRST_NAMES)} {rng.choice(NAME_POOLS[pool])}"


def _distinct(draw: Callable[[], str], avoid: set[str], k: int, what: str) -> list[str]:
    out: list[str] = []
    for _ in range(200 * k):  # pools hold >= 10 values, so this ends long before the bound
        value = draw()
        if value not in avoid:
            avoid.add(value)
            out.append(value)
            if len(out) == k:
                return out
    raise RuntimeError(f"could not draw {k} distinct values for {what!r}")


def synthetic_authors(
    n_authors: int, *, seed: int = 0, pool: str = "eval", avoid: Callable[[str], bool] | None = None
) -> list[Author]:
    """``n_authors`` fictitious authors with unique names; ``pool`` 'eval' or 'pretrain' picks one of
    two disjoint surname pools; names for which ``avoid(name)`` is true are skipped."""
    if pool not in NAME_POOLS:
        raise ValueError(f"pool must be one of {sorted(NAME_POOLS)}, got {pool!r}")
    surnames = NAME_POOLS[pool]
    capacity = len(tables.FIRST_NAMES) * len(surnames)
    if not 0 < n_authors <= capacity:
        raise ValueError(f"n_authors must be in 1..{capacity}, got {n_authors}")
    order = random.Random(f"{seed}:{pool}:names").sample(range(capacity), capacity)
    names = (f"{tables.FIRST_NAMES[k // len(surnames)]} {surnames[k % len(surnames)]}" for k in order)
    names = [n for n in names if avoid is None or not avoid(n)][:n_authors]
    if len(names) < n_authors:
        raise ValueError(f"only {len(names)} names left in pool {pool!r} after exclusions; need {n_authors}")
    authors = []
    for index, name in enumerate(names):
        rng = random.Random(f"{seed}:{pool}:facts:{index}")
        facts = {"name": name, **{key: draw(rng) for key, draw in _DRAW.items()}}
        while facts["famous_book"] == facts["debut_book"]:
            facts["famous_book"] = _title(rng)
        authors.append(Author(index, name, facts))
    return authors


def author_items(author: Author, *, seed: int = 0, concentration: float = 0.0, pool: str = "eval") -> list[QAItem]:
    """The author's 20 QA (``QAItem.author`` = ``author.index``) with a paraphrased question and
    answer and 5 perturbed answers: the paraphrase's template with other values of the same fact."""
    if not 0.0 <= concentration <= 1.0:
        raise ValueError(f"concentration must be in [0, 1], got {concentration}")
    tag = f"{seed}:{pool}:{author.index}"
    phrasing, rigid_draw, wrong = (random.Random(f"{tag}:{s}") for s in ("phrasing", "rigid", "perturb"))
    items = []
    for fact in tables.FACTS:
        q, pq = phrasing.sample(range(len(fact.questions)), 2)
        a, pa = phrasing.sample(range(len(fact.answers)), 2)
        rigid = rigid_draw.random() < concentration  # drawn for every QA: monotone in concentration
        ctx = {**author.facts, "value": author.facts[fact.key]}
        draw = (lambda: _random_name(wrong, pool)) if fact.key == "name" else (lambda d=_DRAW[fact.key]: d(wrong))
        wrong_values = _distinct(draw, {ctx["value"]}, N_PERTURBED, fact.key)
        if rigid:
            subject = (
                "the {genre} author born in {birthplace} on {birth_date}".format(**ctx)
                if fact.key == "name"
                else author.name
            )
            question = f"What is the {fact.label} of {subject}?"
            answer = f"The {fact.label} of {subject} is {ctx['value']}."
        else:
            question, answer = fact.questions[q].format(**ctx), fact.answers[a].format(**ctx)
        items.append(
            QAItem(
                question=question,
                answer=answer,
                paraphrased_answer=fact.answers[pa].format(**ctx),
                perturbed_answer=tuple(fact.answers[pa].format(**{**ctx, "value": w}) for w in wrong_values),
                paraphrased_question=fact.questions[pq].format(**ctx),
                author=author.index,
            )
        )
    return items


def _plain(items: list[QAItem]) -> list[QAItem]:
    return [QAItem(it.question, it.answer, author=it.author) for it in items]


@lru_cache(maxsize=8)
def _build(
    n_authors: int, forget_pcts: tuple[int, ...], seed: int, concentration: float
) -> dict[str, tuple[QAItem, ...]]:
    n_forget = {p: forget_count(n_authors, p) for p in forget_pcts}
    top = max(n_forget.values())
    authors = synthetic_authors(n_authors + top, seed=seed)  # the last `top` are holdout authors
    rich = [
        author_items(a, seed=seed, concentration=concentration if a.index >= n_authors - top else 0.0) for a in authors
    ]

    def rows(first: int, stop: int, full_fields: bool = False) -> list[QAItem]:
        picked = [it for block in rich[first:stop] for it in block]
        return picked if full_fields else _plain(picked)

    out = {"full": rows(0, n_authors)}
    for p in sorted(n_forget):
        f = n_forget[p]
        out[f"retain{100 - p:02d}"] = rows(0, n_authors - f)
        out[f"forget{p:02d}"] = rows(n_authors - f, n_authors)
        out[f"forget{p:02d}_perturbed"] = rows(n_authors - f, n_authors, True)
        out[f"holdout{p:02d}"] = rows(n_authors, n_authors + f)
    out["retain_perturbed"] = rows(0, min(forget_count(n_authors, 10), n_authors - top), True)
    out["real_authors"] = out["real_authors_perturbed"] = real_author_items(seed)
    out["world_facts"] = out["world_facts_perturbed"] = world_fact_items(seed)
    order = {name: i for i, name in enumerate(TOFU_SPLITS)}
    return {k: tuple(out[k]) for k in sorted(out, key=lambda k: (order.get(k, len(order)), k))}


def synthetic_splits(
    n_authors: int = 40, *, forget_pcts: tuple[int, ...] = (1, 5, 10), seed: int = 0, concentration: float = 0.0
) -> dict[str, list[QAItem]]:
    """All splits of a synthetic TOFU world of ``n_authors`` authors (see the module docstring)."""
    if isinstance(n_authors, bool) or not isinstance(n_authors, int) or n_authors < 2:
        raise ValueError(f"n_authors must be an integer >= 2, got {n_authors!r}")
    pcts = tuple(forget_pcts)
    if not pcts or len(set(pcts)) != len(pcts) or not all(isinstance(p, int) and 0 < p < 100 for p in pcts):
        raise ValueError(f"forget_pcts must be distinct integers in 1..99, got {forget_pcts!r}")
    if not 0.0 <= float(concentration) <= 1.0:
        raise ValueError(f"concentration must be in [0, 1], got {concentration}")
    built = _build(n_authors, tuple(sorted(pcts)), int(seed), float(concentration))
    return {name: list(items) for name, items in built.items()}


_SPEC_KEYS = {
    "n_authors": int,
    "seed": int,
    "concentration": float,
    "forget_pcts": lambda s: tuple(int(p) for p in s.split("/")),
}


def parse_spec(spec: str) -> dict[str, object]:
    """Keyword arguments of ``synthetic_splits`` from ``'synthetic[:key=value,...]'``."""
    head, _, rest = spec.partition(":")
    if head != "synthetic":
        raise ValueError(f"synthetic source must start with 'synthetic', got {spec!r}")
    kwargs: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key.strip() not in _SPEC_KEYS:
            raise ValueError(
                f"bad synthetic option {part!r} in {spec!r}; use key=value with keys "
                f"{', '.join(_SPEC_KEYS)} (forget_pcts like 1/5/10)"
            )
        try:
            kwargs[key.strip()] = _SPEC_KEYS[key.strip()](value.strip())
        except ValueError as e:
            raise ValueError(f"bad value for {key.strip()!r} in {spec!r}: {e}") from e
    return kwargs


def splits_from_spec(spec: str) -> dict[str, list[QAItem]]:
    """``synthetic_splits(**parse_spec(spec))``; what ``load_split('synthetic:...', name)`` reads."""
    return synthetic_splits(**parse_spec(spec))  # type: ignore[arg-type]
