"""Streaming vs in-memory erase of a sharded checkpoint: wall time and peak RSS, each path in its own process.

``build`` writes a random-weight checkpoint with a real architecture's tensor names, shapes and
dtype (default Llama-3.2-1B: hidden 2048, 16 layers, MLP 8192, 32 heads, 8 KV heads, vocab 128256,
tied embeddings, bf16: about 2.5 GB) straight into safetensors shards split the way
``save_pretrained(max_shard_size=...)`` splits them (no model is instantiated), and forget / retain
task matrices (float32, as the extractor writes them) for every 2-D weight of the decoder blocks,
one file per block. A few "hot" blocks get 4x the forget energy, so the default ``mean`` rule
edits those. Then ``mmunlearn.erase.stream.stream_erase_checkpoint`` and
``mmunlearn.erase.in_memory.erase_checkpoint`` run on the same inputs, each in a fresh Python
process that reports its wall time and peak resident set (VmHWM: it includes the memory-mapped file
pages a process touched, so loading a model lazily does not hide it). Both outputs are compared
file by file (SHA-256).
"""

from __future__ import annotations

import hashlib
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from mmunlearn.erase.in_memory import erase_checkpoint
from mmunlearn.erase.stream import stream_erase_checkpoint
from mmunlearn.files.layout import PATCH_NAME
from mmunlearn.files.undo_store import default_undo_dir
from mmunlearn.report import table

#: The issue's acceptance bar: streaming peak RSS < TARGET x (largest shard + one block's task matrices).
TARGET = 1.5
GB = 1024**3  # GiB


@dataclass(frozen=True)
class Arch:
    """Tensor layout of a Llama-style decoder (HF names)."""

    name: str
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = True

    def block(self, i: int) -> list[tuple[str, tuple[int, ...]]]:
        h, kv = self.hidden, self.kv_heads * (self.hidden // self.heads)
        p = f"model.layers.{i}."
        return [
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (self.intermediate, h)),
            (p + "mlp.up_proj.weight", (self.intermediate, h)),
            (p + "mlp.down_proj.weight", (h, self.intermediate)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        out = [("model.embed_tokens.weight", (self.vocab, self.hidden))]
        for i in range(self.layers):
            out += self.block(i)
        out.append(("model.norm.weight", (self.hidden,)))
        if not self.tied:
            out.append(("lm_head.weight", (self.vocab, self.hidden)))
        return out

    def config(self) -> dict:
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "vocab_size": self.vocab,
            "tie_word_embeddings": self.tied,
            "torch_dtype": "bfloat16",
            "rms_norm_eps": 1e-5,
        }


ARCHS = {
    "llama-3.2-1b": Arch("llama-3.2-1b", hidden=2048, layers=16, intermediate=8192, heads=32, kv_heads=8, vocab=128256),
    "tiny": Arch("tiny", hidden=64, layers=4, intermediate=256, heads=4, kv_heads=2, vocab=1000),
}


@dataclass
class PathRow:
    path: str  # "stream" or "in-memory"
    seconds: float
    peak_rss: int  # bytes (VmHWM of the child)
    baseline_rss: int  # bytes resident after imports, before any work


@dataclass
class StreamBench:
    arch: str
    model_bytes: int
    shards: int
    largest_shard: int
    layer_task_bytes: int  # one block's forget + retain task matrices
    task_bytes: int  # all task matrices on disk
    rank: int
    hot_layers: list[int]
    shards_rewritten: int
    identical: bool
    rows: list[PathRow] = field(default_factory=list)
    build_seconds: float = 0.0  # writing the random checkpoint and task matrices

    @property
    def target(self) -> float:
        return TARGET * (self.largest_shard + self.layer_task_bytes)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "target_bytes": self.target,
            "target_rule": f"{TARGET} x (largest shard + one block's task matrices)",
        }


def _random(shape: tuple[int, ...], dtype: torch.dtype, seed: int, std: float) -> torch.Tensor:
    """N(0, std^2) entries, generated in row blocks so a float32 copy of a large tensor never exists."""
    g = torch.Generator().manual_seed(seed)
    if len(shape) == 1:
        return torch.ones(shape, dtype=dtype)  # norm weights
    out = torch.empty(shape, dtype=dtype)
    step = max(1, (1 << 24) // shape[1])
    for i in range(0, shape[0], step):
        out[i : i + step] = torch.randn(out[i : i + step].shape, generator=g).mul_(std).to(dtype)
    return out


def build(
    root: Path,
    arch: Arch,
    shard_bytes: int,
    hot: list[int],
    task_layers: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Write ``root/model`` (index + shards + config) and ``root/forget``, ``root/retain`` (one file per block)."""
    from tqdm.auto import tqdm

    model = root / "model"
    model.mkdir(parents=True)
    layout = arch.tensors()
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in layout:  # save_pretrained's rule: close a shard before it would exceed the limit
        nbytes = 2 * _numel(shape)
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += nbytes
    weight_map, sizes = {}, []
    n = len(groups)
    bar = tqdm(total=len(layout), desc="random checkpoint", disable=not progress)
    for k, part in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        tensors = {}
        for name, shape in part:
            tensors[name] = _random(shape, torch.bfloat16, _seed_of(seed, name), 0.02)
            weight_map[name] = fname
            bar.update(1)
        save_file(tensors, str(model / fname), metadata={"format": "pt"})
        sizes.append((model / fname).stat().st_size)
        del tensors
    bar.close()
    total = sum(2 * _numel(s) for _, s in layout)
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    (model / "config.json").write_text(json.dumps(arch.config(), indent=2))
    task_bytes = layer_bytes = 0
    blocks = range(arch.layers if task_layers is None else min(task_layers, arch.layers))
    for kind, gain_seed in (("forget", 1), ("retain", 2)):
        (root / kind).mkdir()
        for i in tqdm(blocks, desc=f"{kind} task matrices", disable=not progress):
            gain = 4.0 if kind == "forget" and i in hot else 1.0
            mats = {
                name: _random(shape, torch.float32, _seed_of(seed + gain_seed, name), 0.01 * gain)
                for name, shape in arch.block(i)
                if len(shape) == 2
            }
            path = root / kind / f"layers.{i:02d}.safetensors"
            save_file(mats, str(path))
            task_bytes += path.stat().st_size
            if i == blocks[0]:
                layer_bytes += path.stat().st_size
            del mats
    return {
        "model_bytes": total,
        "shards": n,
        "largest_shard": max(sizes),
        "task_bytes": task_bytes,
        "layer_task_bytes": layer_bytes,
    }


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def _seed_of(seed: int, name: str) -> int:
    """A stable per-tensor seed (Python's ``hash`` of a string changes between processes)."""
    return (seed * 1_000_003 + int(hashlib.sha256(name.encode()).hexdigest()[:12], 16)) % (2**63)


def _rss(field_name: str) -> int:
    """VmHWM / VmRSS of this process in bytes (ru_maxrss where /proc is missing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _child(argv: list[str]) -> None:
    """One erase path in this process; prints a JSON line with its time and memory."""
    path, model, forget, retain, out, rank, threads = argv
    if threads != "none":
        torch.set_num_threads(int(threads))
    baseline = _rss("VmRSS")
    t0 = time.perf_counter()
    if path == "stream":
        stream_erase_checkpoint(model, forget, out, retain=retain, rank=int(rank), progress=False)
    else:
        erase_checkpoint(model, forget, out, retain=retain, rank=int(rank))
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "peak_rss": _rss("VmHWM"), "baseline_rss": baseline}))


def _run_child(path: str, root: Path, rank: int, threads: int | None) -> PathRow:
    cmd = [
        sys.executable,
        "-m",
        "mmunlearn.bench.stream",
        path,
        str(root / "model"),
        str(root / "forget"),
        str(root / "retain"),
        str(root / f"out-{path}"),
        str(rank),
        "none" if threads is None else str(threads),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the {path} erase failed:\n{proc.stderr[-4000:]}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return PathRow(path="stream" if path == "stream" else "in-memory", **data)


def _digest(path: Path) -> str:
    """SHA-256 of a file; for safetensors, of its metadata and tensors (the header's JSON key order
    varies between processes, so equal files need not be equal bytes)."""
    h = hashlib.sha256()
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            h.update(json.dumps(f.metadata() or {}, sort_keys=True).encode())
            for name in sorted(f.keys()):
                t = f.get_tensor(name)
                h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
                h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy())
                del t
        return h.hexdigest()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def _digests(root: Path) -> dict[str, str]:
    """Digests of an erase output's files and of its undo patch, kept apart in ``<root>.undo/``."""
    files = {p.name: p for p in sorted(root.iterdir()) if p.is_file() and p.name != "erase_report.json"}  # timings
    return {name: _digest(p) for name, p in {**files, PATCH_NAME: default_undo_dir(root) / PATCH_NAME}.items()}


def _check_resources(workdir: Path, arch: Arch, task_layers: int | None) -> None:
    layers = arch.layers if task_layers is None else min(task_layers, arch.layers)
    model = 2 * sum(_numel(s) for _, s in arch.tensors())
    tasks = 2 * 4 * layers * sum(_numel(s) for _, s in arch.block(0) if len(s) == 2)
    need = int(1.1 * (3 * model + tasks))  # model, two outputs (worst case), task matrices
    free = shutil.disk_usage(workdir).free
    if free < need:
        raise RuntimeError(
            f"{workdir} has {free / GB:.1f} GiB free; the benchmark needs about {need / GB:.1f} GiB "
            "(use --workdir elsewhere or fewer --task-layers)"
        )
    ram = _mem_available()
    if ram is not None and ram < model + tasks:  # the in-memory path touches the model and every task matrix
        raise RuntimeError(
            f"{ram / GB:.1f} GiB of RAM available; the in-memory path needs about "
            f"{(model + tasks) / GB:.1f} GiB (use fewer --task-layers)"
        )


def _mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run(
    arch: str = "llama-3.2-1b",
    shard_mb: float = 500,
    hot: list[int] | None = None,
    rank: int = 8,
    task_layers: int | None = None,
    workdir: Path | None = None,
    keep: bool = False,
    threads: int | None = None,
    progress: bool = True,
) -> StreamBench:
    """Build the checkpoint, run both paths in subprocesses, compare their outputs."""
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {sorted(ARCHS)}")
    a = ARCHS[arch]
    hot = sorted({h for h in (hot or [a.layers // 6, a.layers // 2, (5 * a.layers) // 6])})
    if any(not 0 <= h < a.layers for h in hot):
        raise ValueError(f"hot layers {hot} out of range for {a.layers} layers")
    base = Path(workdir) if workdir is not None else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    _check_resources(base, a, task_layers)
    root = Path(tempfile.mkdtemp(dir=base, prefix="mmunlearn-stream-bench-"))
    try:
        t0 = time.perf_counter()
        info = build(root, a, int(shard_mb * 1e6), hot, task_layers, progress=progress)
        built = time.perf_counter() - t0
        rows = [_run_child(p, root, rank, threads) for p in ("stream", "memory")]
        same = _digests(root / "out-stream") == _digests(root / "out-memory")
        model_inodes = {p.stat().st_ino for p in (root / "model").glob("*.safetensors")}
        rewritten = sum(p.stat().st_ino not in model_inodes for p in (root / "out-stream").glob("model-*.safetensors"))
        return StreamBench(
            arch=arch,
            rank=rank,
            hot_layers=hot,
            shards_rewritten=rewritten,
            identical=same,
            rows=rows,
            build_seconds=built,
            **info,
        )
    finally:
        if keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def markdown(b: StreamBench) -> str:
    """The README table."""
    rows = [
        {
            "path": r.path,
            "s": f"{r.seconds:.1f}",
            "peak": f"{r.peak_rss / GB:.2f}",
            "before": f"{r.baseline_rss / GB:.2f}",
        }
        for r in b.rows
    ]
    lines = [
        table(
            rows,
            (("path", "path"), ("wall time (s)", "s"), ("peak RSS (GiB)", "peak"), ("RSS before work (GiB)", "before")),
        ),
        "",
    ]
    lines.append(
        f"{b.arch}: {b.model_bytes / GB:.2f} GiB bf16 in {b.shards} shards (largest {b.largest_shard / GB:.2f} GiB, "
        f"{b.shards_rewritten} rewritten by the streaming path, the others hard-linked), float32 task matrices "
        f"{b.task_bytes / GB:.2f} GiB (one block, forget + retain: {b.layer_task_bytes / GB:.2f} GiB), rank {b.rank}, "
        f"edited blocks {b.hot_layers}; target {TARGET} x (largest shard + one block's task matrices) = "
        f"{b.target / GB:.2f} GiB; outputs identical: {'yes' if b.identical else 'NO'}."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    _child(sys.argv[1:])
