"""The sweep rule's early stop keeps the best in-bound state when training crosses the retain bound."""

import torch

from mmunlearn.methods.rule import SweepRule, early_stop


class _Adapter:
    """A one-weight model whose forget and retain measures are functions of that weight."""

    def __init__(self):
        self.model = torch.nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.model.weight.fill_(0.0)


def test_early_stop_restores_the_in_bound_state_when_the_run_ends_over_the_bound():
    adapter = _Adapter()
    w = lambda a: a.model.weight.item()  # noqa: E731
    rule = SweepRule(
        forget_target=10.0,
        retain_bound=0.5,
        forget_measure=lambda a, _: w(a),
        retain_measure=lambda a, _: max(0.0, w(a) - 2.0),
        checks_per_epoch=1,
    )
    on_step, trajectory, scorer = early_stop(adapter, [0], [0], rule, steps_per_epoch=1)
    stopped = False
    for step in range(1, 10):  # each step adds 1 to the weight: in bound up to w = 2.5
        with torch.no_grad():
            adapter.model.weight.add_(1.0)
        stopped = on_step(step, 0.0)
        if stopped:
            break
    assert stopped and w(adapter) == 3.0 and scorer.over(trajectory[-1]["retain_nll"])
    assert on_step.restore_in_bound() == 2  # the last in-bound state (w = 2) is put back
    assert w(adapter) == 2.0 and trajectory[-1]["restored"] is True
    last = trajectory[-1]
    assert not scorer.over(last["retain_nll"]) and not scorer.reached(last["forget_nll"])  # in bound, target missed


def test_nothing_is_restored_when_the_run_ends_in_bound():
    adapter = _Adapter()
    rule = SweepRule(
        forget_target=2.0,
        retain_bound=0.5,
        forget_measure=lambda a, _: a.model.weight.item(),
        retain_measure=lambda a, _: 0.0,
        checks_per_epoch=1,
    )
    on_step, trajectory, scorer = early_stop(adapter, [0], [0], rule, steps_per_epoch=1)
    for step in (1, 2):
        with torch.no_grad():
            adapter.model.weight.add_(1.0)
        on_step(step, 0.0)
    assert on_step.restore_in_bound() is None and adapter.model.weight.item() == 2.0
    last = trajectory[-1]
    assert scorer.reached(last["forget_nll"]) and not scorer.over(last["retain_nll"])


def test_the_baselines_step_budget_grows_with_the_forget_set():
    from mmunlearn.baselines import BaselineConfig
    from mmunlearn.methods.optimisation import RULE_MIN_STEPS, budget_epochs

    cfg = BaselineConfig(epochs=5, batch_size=16)
    assert budget_epochs(cfg, 21) == 50  # 2 steps an epoch: 50 epochs reach 100 steps
    assert budget_epochs(cfg, 21) * 2 >= RULE_MIN_STEPS
    assert budget_epochs(cfg, 4000) == 5  # a large set keeps its epochs (250 steps each)
    assert budget_epochs(cfg, 161) == 10  # 11 steps an epoch: 10 epochs reach 110 steps


def test_early_stop_scores_steps_1_2_4_before_its_first_regular_check():
    adapter = _Adapter()
    w = lambda a: a.model.weight.item()  # noqa: E731
    # a run that passes the retain bound at step 3, before the first regular check (every 8 steps)
    rule = SweepRule(
        forget_target=100.0,
        retain_bound=0.5,
        forget_measure=lambda a, _: w(a),
        retain_measure=lambda a, _: max(0.0, w(a) - 2.0),
        checks_per_epoch=1,
    )
    on_step, trajectory, scorer = early_stop(adapter, [0], [0], rule, steps_per_epoch=8)
    scored = []
    for step in range(1, 20):
        with torch.no_grad():
            adapter.model.weight.add_(1.0)
        n = len(trajectory)
        stopped = on_step(step, 0.0)
        if len(trajectory) > n:
            scored.append(step)
        if stopped:
            break
    assert scored == [1, 2, 4]  # 4 is over the bound: the run stops there
    assert on_step.restore_in_bound() == 2 and w(adapter) == 2.0  # the in-bound state of step 2, not the start


def test_early_stop_checks_only_the_regular_steps_once_past_the_first():
    adapter = _Adapter()
    rule = SweepRule(
        forget_target=1e9,
        retain_bound=1e9,
        forget_measure=lambda a, _: 0.0,
        retain_measure=lambda a, _: 0.0,
        checks_per_epoch=2,
    )
    on_step, trajectory, _ = early_stop(adapter, [0], [0], rule, steps_per_epoch=16)
    for step in range(1, 33):
        on_step(step, 0.0)
    assert [t["step"] for t in trajectory] == [1, 2, 4, 8, 16, 24, 32]
