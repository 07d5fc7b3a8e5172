"""The one figure helper: a PNG written whole when the drawing ends, nothing when it raises, the figure closed either
way; the plots built on it (TOFU's selectivity plot skips a figure with nothing to draw)."""

import json

import matplotlib.pyplot as plt
import pytest

from mmunlearn.report.figures import figure
from recipes.tofu.report import selectivity_plot


def test_a_figure_is_written_as_png_when_drawn_and_not_at_all_when_drawing_fails(tmp_path):
    before = set(plt.get_fignums())
    with figure(tmp_path / "a.png", figsize=(3, 2)) as (fig, ax):
        ax.plot([0, 1], [1, 0])
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(RuntimeError):
        with figure(tmp_path / "b.png", nrows=1, ncols=2, squeeze=False) as (fig, axes):
            assert axes.shape == (1, 2)
            raise RuntimeError("drawing failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]  # no b.png, no temporary file
    assert set(plt.get_fignums()) == before  # both figures closed


def test_the_selectivity_plot_draws_each_methods_sweep_or_nothing(tmp_path):
    assert selectivity_plot(tmp_path / "s.png", tmp_path, ["qr-erase"], 2.0) is None
    assert not (tmp_path / "s.png").exists()
    (tmp_path / "qr-erase").mkdir()
    sweep = [{"scale": s, "forget_nll": 1 + s, "retain_nll": 1 + s / 10} for s in (2.0, 0.5, 1.0)]
    (tmp_path / "qr-erase" / "run.json").write_text(json.dumps({"info": {"sweep": sweep}}))
    assert selectivity_plot(tmp_path / "s.png", tmp_path, ["qr-erase", "npo"], 2.0) == tmp_path / "s.png"
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
