"""The shared training loop under ``accelerate launch`` with two CPU processes (DDP on gloo) matches one process.

The test launches this module as the training script, with the example config
``examples/accelerate/ddp_cpu.yaml``: each of the 2 processes trains a tiny Llama on batches of
``BATCH`` (so the effective batch is 2 x BATCH) and writes its weights and loss history; the test then
runs the same training in its own process with batches of 2 x BATCH and compares. Examples all have
the same number of labelled tokens, so the mean loss over two half-batches is the mean over the
whole batch and the two runs follow the same trajectory up to float rounding.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "accelerate" / "ddp_cpu.yaml"
N, BATCH, SEQ, VOCAB = 64, 4, 12, 128
# Linear warmup/decay (the scheduler must step once per optimizer step whatever the process count),
# gradient accumulation and clipping; then AdamW with weight decay at a constant rate.
RUNS = {
    "sgd": dict(
        epochs=2, optimizer="sgd", lr=0.5, schedule="linear", warmup=0.25, grad_accum=2, max_grad_norm=1.0, seed=3
    ),
    "adamw": dict(
        epochs=2, optimizer="adamw", lr=3e-3, schedule="constant", weight_decay=0.01, max_grad_norm=None, seed=4
    ),
}


def _data():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, VOCAB, (N, SEQ), generator=g)
    return [{"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x} for x in ids]


def _train(name: str, batch_size: int, **extra):
    from mmunlearn.train import TrainConfig, causal_lm_loss, train
    from tests.tiny import tiny_causal_lm

    model = tiny_causal_lm("llama", vocab=VOCAB, hidden=32, layers=2, seed=0)
    cfg = TrainConfig(batch_size=batch_size, **RUNS[name])
    # "auto" is what the recipes pass; without CUDA it must still join the launcher's process group.
    device = "auto" if name == "adamw" and not torch.cuda.is_available() else "cpu"
    res = train(model, causal_lm_loss, _data(), None, cfg, device=device, progress=False, **extra)
    return model, res


def _worker(out: Path) -> None:
    """Body of each launched process: every run, then an interrupted + resumed copy of the first."""
    from accelerate import PartialState

    rank = int(os.environ["RANK"])  # set by the launcher (torch.distributed.run)
    # Recipe code may ask accelerate who is the main process before training; without cpu=True that
    # records a single process on a CPU launch, and the loop must still train with both.
    assert PartialState().process_index in (0, rank)
    results = {}
    for name in RUNS:
        model, res = _train(name, BATCH)
        results[name] = (model, res)
    ck = out / "ck"
    _train("sgd", BATCH, checkpoint_dir=ck, checkpoint_every=3, on_step=lambda step, loss: step == 5)
    results["resumed"] = _train("sgd", BATCH, checkpoint_dir=ck, checkpoint_every=3, resume=True)
    # a preset build under the launcher: the ranks train it together, rank 0 alone locks and writes
    # (were every rank to take the build lock, rank 1 would wait on it while rank 0 waits on rank 1)
    from mmunlearn.presets.build import build_base

    path, log = build_base(
        "micro",
        "synthetic:n_authors=4",
        cache_dir=out / "cache",
        device="cpu",
        progress=False,
        overrides={"epochs": 1},
        checkpoint_every=None,
    )
    (out / f"base{rank}.json").write_text(json.dumps({"path": str(path), "steps": log["steps"]}))
    torch.save(
        {
            name: {
                "state": m.state_dict(),
                "losses": r.losses,
                "lrs": r.lrs,
                "steps": r.steps,
                "resumed_from": r.resumed_from,
            }
            for name, (m, r) in results.items()
        },
        out / f"rank{rank}.pt",
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process_with_the_double_batch(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIG),
        "--main_process_port",
        str(_free_port()),
        "-m",
        "tests.train.test_distributed",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for name, two in ranks[0].items():
        for key, value in two["state"].items():  # DDP keeps the replicas identical, bit for bit
            assert torch.equal(value, ranks[1][name]["state"][key]), (name, key)
    start = _train_init_state()
    for name in RUNS:
        two = ranks[0][name]
        model, one = _train(name, 2 * BATCH)
        assert two["steps"] == one.steps == 2 * N // (2 * BATCH * RUNS[name].get("grad_accum", 1))
        assert two["lrs"] == one.lrs  # the schedule advances once per optimizer step in both
        assert max(abs(a - b) for a, b in zip(two["losses"], one.losses)) < 1e-5, name
        assert one.losses[-1] < one.losses[0] - 0.05  # training did something
        for key, value in model.state_dict().items():
            assert torch.allclose(two["state"][key], value, atol=2e-5, rtol=1e-4), (name, key)
            moved = not torch.equal(start[key], value)
            assert moved or "norm" in key, (name, key)  # every matrix was trained
    built = [json.loads((tmp_path / f"base{r}.json").read_text()) for r in (0, 1)]
    assert built[0] == built[1]  # same model folder, trained in the same (shared) steps
    base = Path(built[0]["path"])
    assert (base / "model.safetensors").is_file() and (base / "train_log.json").is_file()
    leftovers = [p.name for p in base.parent.iterdir() if p.name != "base" and not p.name.endswith(".lock")]
    assert not leftovers, leftovers  # no second copy or half-written folder from rank 1
    resumed, full = ranks[0]["resumed"], ranks[0]["sgd"]
    assert resumed["resumed_from"] == 3 and resumed["steps"] == full["steps"]
    assert resumed["losses"] == full["losses"] and resumed["lrs"] == full["lrs"]
    assert all(torch.equal(resumed["state"][k], v) for k, v in full["state"].items())


def _train_init_state():
    from tests.tiny import tiny_causal_lm

    return {
        k: v.clone() for k, v in tiny_causal_lm("llama", vocab=VOCAB, hidden=32, layers=2, seed=0).state_dict().items()
    }


if __name__ == "__main__":
    import mmunlearn  # noqa: F401  (before transformers, as everywhere)

    torch.set_num_threads(1)
    _worker(Path(sys.argv[1]))
