"""mmunlearn.presets.parallel: the target and retain models built at once (the retain model in a spawned process),
each with one torch thread, into the cache keys a sequential build uses."""

from mmunlearn.presets.build import build_models
from mmunlearn.presets.parallel import build_models_parallel

DATA = "synthetic:n_authors=10"
TINY = dict(overrides={"max_steps": 2}, pretrain_overrides={"max_steps": 2})


def test_both_models_are_built_at_once_with_one_thread_each_where_a_sequential_build_finds_them(tmp_path):
    built = build_models_parallel(
        "micro", DATA, "forget10", None, 0, tmp_path, "cpu", parallel=True, progress=False, **TINY
    )
    assert built.target.is_dir() and built.retain.is_dir() and built.target != built.retain
    assert built.logs["target"]["torch_threads"] == 1 and built.logs["retain"]["torch_threads"] == 1
    assert built.logs["target"]["n_examples"] > built.logs["retain"]["n_examples"]  # full vs retain90
    again = build_models("micro", DATA, "forget10", None, 0, tmp_path, "cpu", progress=False, **TINY)
    assert (again.base, again.target, again.retain) == (built.base, built.target, built.retain)
    assert again.logs["target"]["cached"] and again.logs["retain"]["cached"]  # nothing trained twice
