"""The requests benchmark's bookkeeping: speed-up over GradDiff from the requests after the first, rule counts,
the peak-memory meter, and one tiny run on prepared manifests (no timing is asserted here): the speaker rule of
``mmunlearn.unlearn`` and the retrained model's "any forgotten" and sink shares beside the requests'."""

import mmap
import time

import pytest

from recipes.requests.speaker import BenchResult, PeakMemory, RequestRow, markdown
from tests.speech_corpus import one_thread, speaker_manifests  # noqa: F401  (fixtures)


def _row(method, extract, request, seconds, forget_after=1.0, retain_rise=0.0):
    return RequestRow(
        dataset="d",
        method=method,
        extract=extract,
        request=request,
        forget_items=4,
        seconds=seconds,
        method_seconds=seconds / 2,
        extract_seconds=0.1,
        forget_before=0.0,
        forget_after=forget_after,
        forget_target=0.9,
        retain_before=1.0,
        retain_after=1.0 + retain_rise,
        retain_bound=0.05,
        reached=forget_after >= 0.9,
        retain_ok=retain_rise <= 0.05,
    )


def test_summary_uses_the_requests_after_the_first_and_counts_the_rule():
    rows = [
        _row("grad_diff", None, 1, 100.0),
        _row("grad_diff", None, 2, 20.0),
        _row("grad_diff", None, 3, 30.0),
        _row("qr-erase", "gradient", 1, 50.0),
        _row("qr-erase", "gradient", 2, 2.0),
        _row("qr-erase", "gradient", 3, 3.0, forget_after=0.5, retain_rise=0.2),
    ]
    res = BenchResult("d", {}, 1.0, rows)
    gd, qr = res.summary()
    assert gd["method"] == "grad_diff" and gd["speedup_vs_grad_diff"] == 1.0
    assert qr["median_seconds_after_first"] == 2.5 and qr["speedup_vs_grad_diff"] == 25.0 / 2.5
    assert qr["first_request_seconds"] == 50.0
    assert (qr["met_rule"], qr["reached_forget"], qr["requests"]) == (2, 2, 3)
    assert abs(qr["max_retain_rise"] - 0.2) < 1e-12
    assert "| qr-erase | gradient | 2.50 |" in markdown(res) and "10.0x" in markdown(res)


def test_peak_memory_sees_an_allocation_that_is_freed_inside_the_block():
    # 64 MiB of fresh pages, each touched: a malloc'd block (a tensor) can reuse pages a long-lived test worker
    # already holds (freed earlier, still resident), and then the resident size does not grow at all
    with PeakMemory() as mem:
        block = mmap.mmap(-1, 64 * 2**20)
        for offset in range(0, len(block), mmap.PAGESIZE):
            block[offset] = 1
        time.sleep(0.1)  # the sampler runs while the block is held
        block.close()
    assert mem.extra >= 48 * 2**20


def test_the_speaker_benchmark_runs_on_prepared_manifests_in_the_head_scope(speaker_manifests, tmp_path):  # noqa: F811
    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
    from recipes.requests.config import RequestsConfig
    from recipes.requests.speaker import run_speaker

    cfg = RequestsConfig(
        workdir=tmp_path,
        preset="tiny",
        manifests=speaker_manifests,
        extract=("gradient",),
        train_epochs=2,
        gd_epochs=1,
        batch=False,
        scope="head",
        progress=False,
    )
    res = run_speaker(cfg)
    assert res.setup["scope"] == "head" and res.setup["qr_erase"]["retain_rank"] == 0
    assert res.setup["manifests"] == str(speaker_manifests) and "manifests" in res.dataset
    assert sorted((r.method, r.request) for r in res.rows) == [("grad_diff", 1), ("qr-erase", 1)]  # one forget speaker
    (model_dir,) = [p for p in tmp_path.iterdir() if p.name.startswith("model-tiny-e2-")]  # keyed by the training set
    assert len(SpeakerAdapter.load(model_dir, device="cpu").speakers) == 4
    # the documented speaker rule (worst forgotten speaker's share predicted as none of them), not 1 - accuracy
    assert res.setup["rule"]["forget_measure"] == "worst_speaker_error_rate"
    assert res.setup["rule"]["forget_target"] == pytest.approx(1 - 1 / 4)
    qr = next(r for r in res.rows if r.method == "qr-erase")
    assert qr.reached == (qr.forget_after >= qr.forget_target) and qr.detail["sweep_points"] >= 1
    # forgetting counted as "any forgotten speaker": with one forgotten speaker, its accuracy on train + held-out
    from mmunlearn.data.utterances import split_rows
    from mmunlearn.eval.speaker import accuracy
    from recipes.requests.speaker import forgotten_share

    gone = split_rows(speaker_manifests, "spk_forget_train") + split_rows(speaker_manifests, "spk_forget_test")
    for r in res.rows:
        assert 0.0 <= r.forgotten_any <= 1.0 and 0.0 <= r.forgotten_sink <= 1.0
        assert r.forgotten_any + r.forgotten_sink <= 1.0 + 1e-9
    original = SpeakerAdapter.load(model_dir, device="cpu")
    assert forgotten_share(original, gone)[0] == pytest.approx(accuracy(original, gone, desc=None))
    # beside them the retrained model's: trained without the forgotten speaker's audio, same classes
    re = res.setup["retrained"]
    retrained = SpeakerAdapter.load(re["model"], device="cpu")
    assert retrained.speakers == original.speakers and re["model"] != str(model_dir)
    assert (re["forgotten_any"], re["forgotten_sink"]) == pytest.approx(forgotten_share(retrained, gone))
    table = markdown(res)
    assert all(line.count("|") == 12 for line in table.splitlines())  # every column, none cut
    assert "forgotten -> any forgotten % (max)" in table
    assert table.splitlines()[-1].startswith("| retrained model |")


@pytest.mark.slow
def test_the_tofu_benchmark_runs_one_request_per_forget_author(tmp_path):
    from recipes.requests.config import RequestsConfig
    from recipes.requests.tofu import run_tofu

    cfg = RequestsConfig(
        dataset="tofu", preset="micro", extract=("gradient",), authors=None, workdir=tmp_path / "work", progress=False
    )
    res = run_tofu(cfg, cache_dir=tmp_path / "cache")
    requests = sorted({r.request for r in res.rows})
    assert requests == list(range(1, len(requests) + 1)) and len(requests) >= 2
    assert sorted((r.method, r.request) for r in res.rows) == sorted(
        (m, i) for m in ("grad_diff", "qr-erase") for i in requests
    )
    for r in res.rows:  # the rule's verdicts are the measures against the target and the bound
        assert r.reached == (r.forget_after >= r.forget_target)
        assert r.retain_ok == (r.retain_after - r.retain_before <= r.retain_bound)
