"""The VoxCeleb2 tables tell the truth: the sweep's time over every scope, the "closest within the bound" note only
for models within the bound, and run.json naming the rule's forget measure (old files still read)."""

from recipes.voxceleb2 import pipeline as pipe
from recipes.voxceleb2 import report


def _row(method, reached, within, **extra):
    return {"method": method, "forget_acc": 0.5, "target_reached": reached, "within_bound": within, **extra}


def test_missed_rule_notes_tell_in_bound_from_over_bound_models():
    rows = [
        _row("original model", None, None),
        _row("qr-erase", False, True),
        _row("grad_diff", False, False),
        _row("npo", True, True),
    ]
    md = report.markdown(rows, "speaker")
    assert "Sweep rule not met by: qr-erase, grad_diff." in md
    assert "qr-erase: the chosen setting is the one closest to the target within the retain bound." in md
    assert "grad_diff: the chosen model is OVER the retain bound" in md
    assert "grad_diff: the chosen setting is the one closest" not in md
    assert "closest" not in report.markdown([_row("kl", False, False)], "speaker")


def test_the_table_shows_the_sweep_time_over_every_scope():
    md = report.markdown([_row("qr-erase", True, True, total_seconds=22.0, sweep_seconds=505.0)], "speaker")
    header, _, line = md.splitlines()[:3]
    cells = dict(zip(header.split("|"), line.split("|")))
    assert cells[" sweep s (all scopes) "].strip() == "505.0" and cells[" + extraction s "].strip() == "22.0"


def test_within_bound_reads_the_rule():
    assert pipe.within_bound({"retain": 1.2, "base_retain": 1.0, "retain_bound": 0.05}) is False
    assert pipe.within_bound({"retain": 1.03, "base_retain": 1.0, "retain_bound": 0.05}) is True
    assert pipe.within_bound(None) is None


def test_run_json_names_the_forget_measure_and_old_files_still_read():
    info = {"sweep": [{"rank": 1, "scale": 0.5, "forget_nll": 0.8, "retain_nll": 1.1}], "chosen": {"rank": 1}}
    named = pipe.rename_measure(info, pipe.measure_field("error_rate"))
    assert named["sweep"] == [{"rank": 1, "scale": 0.5, "forget_error_rate": 0.8, "retain_nll": 1.1}]
    assert named["forget_field"] == "forget_error_rate" and "forget_nll" not in named["sweep"][0]
    assert (
        pipe.measure_field("log_loss_gap") == "forget_log_loss_gap" and pipe.measure_field("mean_nll") == "forget_nll"
    )
    new, old = pipe.sweep_points({"info": named}), pipe.sweep_points({"info": info})
    assert new == old == [{"rank": 1, "scale": 0.5, "forget": 0.8, "retain": 1.1}]
