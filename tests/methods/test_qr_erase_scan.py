"""examples/qr_erase_scan.py end to end on tiny models (target, its base and a retain model saved as folders):
every point of the cross is written with the rule's measures, a rerun resumes, the per-block scan and its plot."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.data.tofu import load_split
from mmunlearn.taskvec.extract import ExtractConfig, extract_task_matrices
from tests.tiny import tiny_causal_lm, tiny_tokenizer

SRC = "synthetic:n_authors=10"
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "qr_erase_scan.py"


def _script():
    spec = importlib.util.spec_from_file_location("qr_erase_scan", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fine_tuned(ad, rows):
    out = ad.clone()
    tm = extract_task_matrices(
        out, rows, ExtractConfig(kind="finetune", steps=6, lr=3e-3, batch_size=8), progress=False
    )
    with torch.no_grad():
        params = dict(out.model.named_parameters())
        for n, t in tm.items():
            params[n].add_(t)
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("scan")
    base = TextLLMAdapter(tiny_causal_lm(layers=3), tiny_tokenizer())
    forget, retain = load_split(SRC, "forget10"), load_split(SRC, "retain90")
    base.save(root / "base")
    _fine_tuned(base, forget + retain[:40]).save(root / "target")
    _fine_tuned(base, retain[:40]).save(root / "retain")
    return root


def test_scan_crosses_records_resumes_and_scans_blocks(folders):
    scan = _script()
    out = folders / "scan.json"
    argv = [
        "--target",
        str(folders / "target"),
        "--base",
        str(folders / "base"),
        "--retain-model",
        str(folders / "retain"),
        "--data",
        SRC,
        "--retain-items",
        "12",
        "--precision",
        "no",
        "--protocols",
        "update,layerwise,gradient",
        "--ranks",
        "4",
        "--retain-ranks",
        "0,8",
        "--layer-rules",
        "mean,top1",
        "--subtractions",
        "own,swept",
        "--steps",
        "2",
        "--layerwise-steps",
        "1",
        "--lr",
        "1e-3",
        "--block-rank",
        "4",
        "--block-retain-rank",
        "8",
        "--best",
        "2",
        "--json",
        str(out),
    ]
    results = scan.main(argv)
    on_disk = json.loads(out.read_text())
    assert on_disk["points"] == results["points"]
    keys = [p["key"] for p in on_disk["points"]]
    assert len(keys) == len(set(keys)) == 3 * 1 * 2 * 2 * 2  # protocols x ranks x retain ranks x rules x subtractions
    for p in on_disk["points"]:
        # the rule's measures of each point, consistent with one another
        assert p["forget_rise"] == pytest.approx(p["forget_nll"] - on_disk["base_forget_nll"])
        assert p["met"] == (p["forget_nll"] >= on_disk["forget_target"] and p["retain_rise"] <= on_disk["bound"])
        assert (p["points"] == 1 and p["scale"] == 1.0) if p["subtraction"] == "own" else p["points"] >= 1
        if p["layer_rule"] == "top1":
            assert len(p["selected_layers"]) == 1
    # the training update at its own size, full subtraction, moves the forget NLL up (the target learnt the forget rows)
    own = next(p for p in on_disk["points"] if p["key"] == "update|4|0|mean|own")
    assert own["forget_rise"] > 0
    blocks = on_disk["blocks"]
    assert [b["block"] for b in blocks] == [f"model.layers.{i}" for i in range(3)]
    assert sum(b["energy"] for b in blocks) == pytest.approx(1.0)
    assert out.with_suffix(".blocks.png").stat().st_size > 1000
    assert sorted(f.name for f in out.with_suffix(".taskvec").iterdir()) == sorted(
        f"{p}.{side}.safetensors" for p in ("update", "layerwise", "gradient") for side in ("forget", "retain")
    )
    # the best points within the bound, edited again: what the model still says of the forget rows
    measured = [p for p in on_disk["points"] if "forget_rouge_l" in p]
    within = sorted(
        (p for p in on_disk["points"] if p["retain_rise"] <= on_disk["bound"]),
        key=lambda p: (p["met"], p["forget_rise"]),
        reverse=True,
    )
    assert [p["key"] for p in measured] == sorted([p["key"] for p in within[:2]], key=keys.index)
    assert all(0 <= p["forget_rouge_l"] <= 1 and 0 < p["forget_prob"] < 1 for p in measured)
    assert set(on_disk["reference_outputs"]) == {"target", "retain_model"}
    assert all(0 <= p["scoring_seconds"] <= p["seconds"] for p in on_disk["points"])
    # a rerun resumes: nothing is scored again, the records stay as they were
    again = scan.main(argv)
    assert [p["key"] for p in again["points"]] == keys and again["blocks"] == blocks
    assert [p["seconds"] for p in again["points"]] == [p["seconds"] for p in on_disk["points"]]
    # ... but not with other settings, whose points would not compare
    with pytest.raises(SystemExit, match="retain_items"):
        scan.main([a if a != "12" else "13" for a in argv])


def test_scan_refuses_an_unknown_protocol_or_rule(folders, tmp_path):
    scan = _script()
    base = [
        "--target",
        str(folders / "target"),
        "--base",
        str(folders / "base"),
        "--data",
        SRC,
        "--retain-items",
        "4",
        "--precision",
        "no",
        "--ranks",
        "2",
        "--retain-ranks",
        "0",
        "--subtractions",
        "own",
        "--best",
        "0",
    ]
    with pytest.raises(SystemExit, match="not one of"):
        scan.main(base + ["--protocols", "magic", "--json", str(tmp_path / "a.json")])
    with pytest.raises(SystemExit, match="topK"):
        scan.main(base + ["--protocols", "gradient", "--layer-rules", "middle", "--json", str(tmp_path / "b.json")])
