"""The erasure method's sweep: the training-partition rule, auto scales and bisection."""

import pytest
import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split
from mmunlearn.methods import RunContext, SweepRule, mean_nll
from mmunlearn.methods.erasure import AUTO_RELATIVE, EraseConfig, relative_unit, run
from mmunlearn.methods.rule import SweepPoint, choose
from mmunlearn.taskvec.extract import ExtractConfig
from tests.tiny import tiny_causal_lm, tiny_tokenizer


def test_choose_rule():
    pts = [
        SweepPoint(8, 1, 1.0, 0.50),
        SweepPoint(8, 2, 2.0, 0.55),
        SweepPoint(8, 4, 3.0, 0.58),
        SweepPoint(8, 8, 4.0, 0.9),
    ]
    # target reached within the bound: the reaching point with the smallest retain NLL
    assert choose(pts, 0.5, 0.5, forget_target=2.5, retain_bound=0.1).scale == 4
    # target not reached within bound: the highest forget NLL within bound
    assert choose(pts, 0.5, 0.5, forget_target=10.0, retain_bound=0.1).scale == 4
    # nothing within bound: the smallest edit
    assert choose(pts, 0.5, 0.3, forget_target=10.0, retain_bound=0.01).scale == 1


def test_auto_sweep_doubles_then_bisects_and_obeys_the_bound():
    src = "synthetic:n_authors=10"
    forget, retain = load_split(src, "forget10")[:10], load_split(src, "retain90")[:20]
    ad = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    base_r = mean_nll(ad, retain)
    cfg = EraseConfig(rank=4, retain_rank=8, extract=ExtractConfig(kind="gradient", lr=1.0))
    res = run(
        ad,
        forget,
        retain,
        cfg,
        RunContext("text", rule=SweepRule(forget_target=1e9, retain_bound=0.05), progress=False),
    )
    sweep = [SweepPoint(**p) for p in res.info["sweep"]]
    grid = [p for p in sweep if any(p.relative == pytest.approx(u) for u in AUTO_RELATIVE)]
    # the grid is in units of the task vectors' size: relative edit sizes 0.001, 0.002, ... in order
    assert [p.relative for p in grid] == pytest.approx(list(AUTO_RELATIVE[: len(grid)]))
    assert all(
        p.scale * p.relative > 0 and p.relative / p.scale == pytest.approx(sweep[0].relative / sweep[0].scale)
        for p in sweep
    )
    assert 0 < len(grid) <= len(sweep) <= len(grid) + cfg.sweep_bisections  # bisection after the crossing
    # the doubling stops at the first grid point past the bound (the target 1e9 is out of reach), or runs out
    assert all(p.retain_nll - base_r <= 0.05 for p in grid[:-1])
    assert grid[-1].retain_nll - base_r > 0.05 or len(grid) == len(AUTO_RELATIVE)
    chosen = next(p for p in sweep if p.scale == res.info["chosen"]["scale"])
    assert chosen.retain_nll - base_r <= 0.05
    # the applied edit is the chosen one: the model now scores what the sweep measured
    assert mean_nll(ad, forget) == pytest.approx(chosen.forget_nll, rel=1e-5)


def test_relative_unit_is_the_task_to_weight_norm_ratio():
    import torch

    model = tiny_causal_lm(layers=1)
    name, w = next((n, p) for n, p in model.named_parameters() if p.dim() == 2 and "proj" in n)
    tf = {name: torch.full_like(w, 0.5)}
    assert relative_unit(model, tf) == pytest.approx(float(tf[name].norm() / w.detach().norm()), rel=1e-6)
    with pytest.raises(ValueError, match="all zero"):
        relative_unit(model, {name: torch.zeros_like(w)})


def test_when_the_smallest_grid_size_passes_the_bound_the_sweep_halves_down_to_it():
    src = "synthetic:n_authors=10"
    forget, retain = load_split(src, "forget10")[:10], load_split(src, "retain90")[:20]
    ad = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    base_r = mean_nll(ad, retain)
    cfg = EraseConfig(rank=4, retain_rank=8, extract=ExtractConfig(kind="gradient", lr=1.0))
    probe = run(
        ad.clone(),
        forget,
        retain,
        cfg,
        RunContext("text", rule=SweepRule(forget_target=1e9, retain_bound=10.0), progress=False),
    )
    first = SweepPoint(**probe.info["sweep"][0])  # the grid's smallest edit, 0.001 of the weights' norm
    bound = (first.retain_nll - base_r) / 20  # so small that this edit passes it
    res = run(
        ad,
        forget,
        retain,
        cfg,
        RunContext("text", rule=SweepRule(forget_target=1e9, retain_bound=bound), progress=False),
    )
    sweep = [SweepPoint(**p) for p in res.info["sweep"]]
    assert sweep[0].relative == pytest.approx(AUTO_RELATIVE[0]) and sweep[0].retain_nll - base_r > bound
    halved = [p.relative for p in sweep[1:] if p.relative < AUTO_RELATIVE[0] * 0.99]
    assert halved and halved[0] == pytest.approx(AUTO_RELATIVE[0] / 2)  # down by halves, not stopped at 0.001
    chosen = next(p for p in sweep if p.scale == res.info["chosen"]["scale"])
    assert chosen.relative < AUTO_RELATIVE[0] and chosen.retain_nll - base_r <= bound


@pytest.mark.parametrize("past_bound", [False, True])
def test_past_bound_looks_beyond_a_stretch_over_the_retain_bound(past_bound):
    """A retain measure that rises and falls again with the edit size (a speaker head's forgotten rows turning away):
    with ``past_bound`` the sweep goes on past the bump and returns an edit that meets the rule; without, it stops."""
    from types import SimpleNamespace

    import torch

    from mmunlearn.methods.erasure import _sweep
    from mmunlearn.methods.rule import Scorer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6, bias=False))
    w0 = model[0].weight.detach().clone()
    task = torch.outer(torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)).float()

    def size(adapter, _rows):  # the relative edit size the model carries now
        return float((adapter.model[0].weight.detach() - w0).norm() / w0.norm())

    def bump(adapter, _rows):  # over the bound (0.05) only for edits between 0.5 and 2 of the weights' norm
        return 0.1 if 0.5 < size(adapter, _rows) < 2.0 else 0.0

    target = SimpleNamespace(model=model)
    rule = SweepRule(forget_target=4.0, retain_bound=0.05, forget_measure=size, retain_measure=bump)
    cfg = EraseConfig(rank=1, retain_rank=0, localize=False, sweep_max_relative=32.768)
    points, best = _sweep(
        target, {"0.weight": task}, None, cfg, Scorer(rule, target, [1], [1]), None, False, past_bound=past_bound
    )
    assert torch.equal(model[0].weight.detach(), w0)  # every candidate was undone
    if past_bound:
        assert any(p.retain_nll > 0.05 for p in points)  # it went through the bump
        assert best.forget_nll >= 4.0 and best.retain_nll <= 0.05  # and found an edit that meets the rule
        assert best.forget_nll < 8.0  # narrowed from below, not the largest edit tried
    else:
        assert max(p.forget_nll for p in points) < 4.0  # stopped at the bump


def test_task_vectors_only_in_the_layers_training_changed():
    import torch

    from mmunlearn.methods.erasure import trained_layers

    src = "synthetic:n_authors=10"
    forget, retain = load_split(src, "forget10")[:10], load_split(src, "retain90")[:20]
    reference = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    target = reference.clone()
    assert trained_layers(reference, target) is None  # a copy: nothing tells the layers apart, every one is used
    names = [lw.name for lw in target.layers()]
    trained = names[1]
    with torch.no_grad():  # "training" changed one layer alone (a frozen-tower model's projector)
        dict(target.model.named_parameters())[trained].add_(0.01)
    assert trained_layers(reference, target) == [trained]
    cfg = EraseConfig(
        rank=2,
        retain_rank=4,
        scale=1.0,
        localize=False,
        trained_only=True,
        extract=ExtractConfig(kind="gradient", lr=1.0),
    )
    before = {n: p.detach().clone() for n, p in target.model.named_parameters()}
    res = run(target, forget, retain, cfg, RunContext("text", reference=reference, progress=False))
    assert res.info["trained_layers"] == [trained]
    edited = [n for n, p in target.model.named_parameters() if not torch.equal(p, before[n])]
    assert edited == [trained]
    # the paper's protocol (every layer's task vector, the default) edits the frozen layers too
    assert EraseConfig().trained_only is False
    other = reference.clone()
    with torch.no_grad():
        dict(other.model.named_parameters())[trained].add_(0.01)
    wide = run(
        other,
        forget,
        retain,
        EraseConfig(**{**vars(cfg), "trained_only": False}),
        RunContext("text", reference=reference, progress=False),
    )
    assert "trained_layers" not in wide.info
    assert len([n for n, p in other.model.named_parameters() if not torch.equal(p, before[n])]) > 1


def test_trained_layers_refuses_a_reference_of_another_architecture():
    from mmunlearn.methods.erasure import trained_layers

    a = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    b = TextLLMAdapter(tiny_causal_lm(layers=3), tiny_tokenizer())
    with pytest.raises(ValueError, match="reference's layers"):
        trained_layers(a, b)


class RowsAtLevel:
    """A forget measure judged row by row (as mmunlearn.unlearn's text rule is): the share of rows whose answer NLL
    reached its own level; ``details`` names the rows still below theirs."""

    __name__ = "rows_at_level"

    def __init__(self, rows, levels):
        self.rows, self.levels = rows, levels

    def details(self, adapter, *, greedy, items=None):
        nlls = adapter.answer_nll(self.rows).tolist()
        return {"out": [i for i, (v, lv) in enumerate(zip(nlls, self.levels)) if v < lv]}

    def __call__(self, adapter, items):
        return 1.0 - len(self.details(adapter, greedy=False, items=items)["out"]) / len(self.rows)


def test_rounds_erase_the_rows_the_first_edit_left_and_one_patch_undoes_all():
    """rounds=2: the first edit aims at half the rows; the rows it left (a hard row whose level is far above its NLL)
    get an edit of their own, made on top and aimed at every row; the report says each round's rows and choice, the
    model scores as the rule judged it, and the one undo patch returns the original bits. With a rule that judges no
    rows, one edit and the report says why."""
    from mmunlearn.erase import restore
    from mmunlearn.train import TrainConfig, train

    src = "synthetic:n_authors=10"
    forget, retain = load_split(src, "forget10")[:6], load_split(src, "retain90")[:20]
    ad = TextLLMAdapter(tiny_causal_lm(layers=2, seed=3), tiny_tokenizer())
    config = TrainConfig(epochs=8, lr=3e-3, batch_size=8, seed=0)
    train(ad.model, lambda m, b: ad.loss(b, model=m), forget + retain, ad.collate, config, progress=False)
    ad.model.eval()
    original = {k: v.detach().clone() for k, v in ad.model.state_dict().items()}
    before = ad.answer_nll(forget).tolist()
    levels = [v + (0.05 if i < 4 else 0.6) for i, v in enumerate(before)]  # four easy rows, two hard ones
    measure = RowsAtLevel(forget, levels)
    cfg = EraseConfig(rank=4, retain_rank=8, extract=ExtractConfig(kind="gradient", lr=1.0), rounds=2, round_share=0.5)
    rule = SweepRule(forget_target=1.0, retain_bound=10.0, forget_measure=measure)
    res = run(ad, forget, retain, cfg, RunContext("text", rule=rule, progress=False))
    rounds = res.info["rounds"]
    assert rounds[0]["rows"] == 6 and rounds[0]["met"]  # the first edit took out at least half the rows
    assert len(rounds) == 2 and 1 <= rounds[1]["rows"] <= 3  # the rows it left got a second edit
    assert rounds[1]["met"] and measure(ad, forget) == 1.0  # every row at its level now
    assert res.erase_report.seconds > 0 and len({e.label for e in res.erase_report.patch.entries}) == len(
        res.erase_report.patch.entries
    )  # one record per matrix
    restore(ad.model, res.erase_report)
    assert all(torch.equal(original[k], v) for k, v in ad.model.state_dict().items())
    # a rule that judges a mean, not rows: one edit, said in the report
    plain = run(
        TextLLMAdapter(tiny_causal_lm(layers=2, seed=3), tiny_tokenizer()),
        forget,
        retain,
        cfg,
        RunContext("text", rule=SweepRule(forget_target=max(before) + 0.5, retain_bound=10.0), progress=False),
    )
    assert "rounds do not apply" in plain.info["rounds"][0]["note"]


def test_row_retain_rank_is_used_under_a_rule_that_judges_rows_only():
    """row_retain_rank replaces retain_rank when the rule judges forget rows one by one: the edit is the one
    retain_rank=row_retain_rank makes, bit for bit; under a rule that judges a mean, retain_rank stays."""
    src = "synthetic:n_authors=10"
    forget, retain = load_split(src, "forget10")[:6], load_split(src, "retain90")[:20]
    base = TextLLMAdapter(tiny_causal_lm(layers=2, seed=5), tiny_tokenizer())
    levels = [v + 0.3 for v in base.answer_nll(forget).tolist()]
    ex = ExtractConfig(kind="gradient", lr=1.0)

    def edited(cfg, rule):
        ad = TextLLMAdapter(tiny_causal_lm(layers=2, seed=5), tiny_tokenizer())
        res = run(ad, forget, retain, cfg, RunContext("text", rule=rule, progress=False))
        return res.info["retain_rank"], ad.model.state_dict()

    rows = SweepRule(forget_target=1.0, retain_bound=10.0, forget_measure=RowsAtLevel(forget, levels))
    got, state = edited(EraseConfig(rank=4, retain_rank=8, row_retain_rank=2, extract=ex), rows)
    want, same = edited(EraseConfig(rank=4, retain_rank=2, extract=ex), rows)
    assert got == want == 2 and all(torch.equal(state[k], same[k]) for k in state)
    _, other = edited(EraseConfig(rank=4, retain_rank=8, extract=ex), rows)
    assert any(not torch.equal(state[k], other[k]) for k in state)  # the retain rank changes the edit here
    mean = SweepRule(forget_target=max(levels) + 0.5, retain_bound=10.0)
    assert edited(EraseConfig(rank=4, retain_rank=8, row_retain_rank=2, extract=ex), mean)[0] == 8


def _toy_sweep(sweep_retain: str, forget_target: float, retain_bound: float, first: float | None = None):
    """``_sweep`` on one linear layer whose measures grow with the edit's relative size r: forget 10 r, retain r^2;
    the points, the choice and how often the retain measure was scored."""
    from types import SimpleNamespace

    from mmunlearn.methods.erasure import _sweep
    from mmunlearn.methods.rule import Scorer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6, bias=False))
    w0 = model[0].weight.detach().clone()
    task = torch.outer(torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)).float()
    calls = {"retain": 0}

    def size(adapter):
        return float((adapter.model[0].weight.detach() - w0).norm() / w0.norm())

    def forget(adapter, _rows):
        return 10 * size(adapter)

    def retain(adapter, _rows):
        calls["retain"] += 1
        return size(adapter) ** 2

    target = SimpleNamespace(model=model)
    rule = SweepRule(
        forget_target=forget_target, retain_bound=retain_bound, forget_measure=forget, retain_measure=retain
    )
    cfg = EraseConfig(rank=1, retain_rank=0, localize=False, sweep_retain=sweep_retain, sweep_first=first)
    points, best = _sweep(target, {"0.weight": task}, None, cfg, Scorer(rule, target, [1], [1]), None, False)
    assert torch.equal(model[0].weight.detach(), w0)  # every candidate was undone
    return points, best, calls["retain"]


@pytest.mark.parametrize(
    "forget_target, retain_bound, met",
    [
        (0.5, 0.01, True),  # the forget target (r = 0.05) comes before the bound (r = 0.1)
        (2.0, 0.01, False),  # the bound comes first: the most forgetting within it
        (100.0, 10.0, False),  # neither within the grid: its largest edit
    ],
)
def test_scoring_the_retain_measure_where_needed_chooses_what_scoring_it_everywhere_does(
    forget_target, retain_bound, met
):
    every, best_every, calls_every = _toy_sweep("every", forget_target, retain_bound)
    lazy, best_lazy, calls_lazy = _toy_sweep("needed", forget_target, retain_bound)
    assert best_lazy.scale == pytest.approx(best_every.scale, rel=1e-9)
    assert best_lazy.retain_nll == pytest.approx(best_every.retain_nll) and best_lazy.retain_nll is not None
    assert (best_lazy.forget_nll >= forget_target and best_lazy.retain_nll <= retain_bound) == met
    assert all(p.retain_nll is not None for p in every)
    # the unedited model's scoring is one call in each; the lazy sweep scores the retain rows at far fewer points
    assert calls_every == 1 + len(every)
    assert calls_lazy == 1 + sum(p.retain_nll is not None for p in lazy) < calls_every
    if met:  # one retain scoring: the smallest edit that reached the forget target
        assert calls_lazy == 2
        assert best_lazy.forget_nll == min(p.forget_nll for p in lazy if p.forget_nll >= forget_target)


@pytest.mark.parametrize("sweep_retain", ["needed", "every"])
def test_a_first_size_past_the_target_is_narrowed_to_what_a_fresh_sweep_chooses(sweep_retain):
    """An earlier request's size that meets the rule far past the forget target (forget 3.7 for a target of 0.5,
    retain within a loose bound) is not kept: halvings and a bisection bring it to the crossing a sweep from the
    grid's bottom finds (forget 10 r reaches 0.5 at r = 0.05)."""
    _, fresh, _ = _toy_sweep(sweep_retain, 0.5, 1.0)
    points, best, _ = _toy_sweep(sweep_retain, 0.5, 1.0, first=0.37)
    assert points[0].relative == pytest.approx(0.37) and points[0].forget_nll >= 0.5  # it met the rule
    assert best.forget_nll >= 0.5 and best.retain_nll is not None and best.relative < 0.37 / 6
    assert best.relative == pytest.approx(fresh.relative, rel=2 ** (1 / 8) - 1)  # the bisection's precision
    assert min(p.relative for p in points) > 0.37 / 2**4  # halvings stop once the target is missed


def test_a_sweep_scoring_retain_where_needed_records_the_points_it_skipped_and_applies_a_scored_one():
    src = "synthetic:n_authors=10"
    forget, retain = load_split(src, "forget10")[:10], load_split(src, "retain90")[:20]
    ad = TextLLMAdapter(tiny_causal_lm(layers=2), tiny_tokenizer())
    base_f = mean_nll(ad, forget)
    cfg = EraseConfig(rank=4, retain_rank=8, sweep_retain="needed", extract=ExtractConfig(kind="gradient", lr=1.0))
    rule = SweepRule(forget_target=base_f + 0.005, retain_bound=10.0)  # reached near a relative edit of 0.1
    res = run(ad, forget, retain, cfg, RunContext("text", rule=rule, progress=False))
    sweep = [SweepPoint(**p) for p in res.info["sweep"]]
    chosen = next(p for p in sweep if p.scale == res.info["chosen"]["scale"])
    assert chosen.retain_nll is not None and chosen.forget_nll >= rule.forget_target
    skipped = [p for p in sweep if p.retain_nll is None]
    # the retain measure was left out where the choice did not need it: short of the target, or past the chosen edit
    assert skipped and all(p.forget_nll < rule.forget_target or p.scale > chosen.scale for p in skipped)
    assert mean_nll(ad, forget) == pytest.approx(chosen.forget_nll, rel=1e-5)
    with pytest.raises(ValueError, match="sweep_retain"):
        run(ad.clone(), forget, retain, EraseConfig(sweep_retain="some"), RunContext("text", rule=rule, progress=False))


def test_a_rule_judging_forget_rows_one_by_one_scores_the_retain_measure_at_every_point():
    """'needed' applies to a mean forget measure; a per-row measure (it has ``details``) keeps every point scored."""
    from types import SimpleNamespace

    from mmunlearn.methods.erasure import _sweep
    from mmunlearn.methods.rule import Scorer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6, bias=False))
    w0 = model[0].weight.detach().clone()
    task = torch.outer(torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)).float()

    class RowsGone:  # a stand-in for the per-row measure: the share of rows "gone" grows with the edit
        def __call__(self, adapter, _rows):
            return min(1.0, 10 * float((adapter.model[0].weight.detach() - w0).norm() / w0.norm()))

        def details(self, *a, **k):
            return {"out": []}

    target = SimpleNamespace(model=model)
    rule = SweepRule(forget_target=0.5, retain_bound=0.01, forget_measure=RowsGone(), retain_measure=lambda a, r: 0.0)
    cfg = EraseConfig(rank=1, retain_rank=0, localize=False, sweep_retain="needed")
    points, best = _sweep(target, {"0.weight": task}, None, cfg, Scorer(rule, target, [1], [1]), None, False)
    assert all(p.retain_nll is not None for p in points) and best.forget_nll >= 0.5
