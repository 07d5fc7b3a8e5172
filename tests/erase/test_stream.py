"""Streaming erase/restore of sharded checkpoints: bitwise equal to the in-memory path, linked untouched
shards, atomic output, one shard and two task matrices resident at a time, lazy task-matrix layouts."""

import json
import os
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from mmunlearn.cli import app
from mmunlearn.erase import stream as st
from mmunlearn.erase.energy import group_of
from mmunlearn.erase.in_memory import erase_checkpoint, restore_checkpoint
from mmunlearn.files.checkpoint import MARKER
from mmunlearn.taskvec.store import LazyTaskMatrices, load_task_matrices, open_task_matrices, save_task_matrices
from tests.tiny import ConvExperts, block_task_matrices, tiny_llama


def save_by_group(root: Path, tm: dict) -> Path:
    """One task-matrix file per layer group (the streaming layout)."""
    root.mkdir()
    groups: dict[str, dict] = {}
    for name, t in tm.items():
        groups.setdefault(group_of(name), {})[name] = t
    for g, part in groups.items():
        save_task_matrices(root / f"{g}.safetensors", part)
    return root


@pytest.fixture
def sharded(tmp_path):
    model = tiny_llama()
    src = tmp_path / "model"
    model.save_pretrained(src, max_shard_size="20KB")
    tf = save_by_group(tmp_path / "forget", block_task_matrices(model, hot=2, seed=1))
    tr = save_task_matrices(tmp_path / "retain.safetensors", block_task_matrices(model, hot=0, seed=2))
    return src, tf, tr


def files(root: Path) -> dict[str, bytes]:
    """Every file's bytes, but the output marker (an mmunlearn output has one, a save_pretrained folder not)."""
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file() and p.name != MARKER}


def same_content(a: Path, b: Path) -> bool:
    """Equal safetensors files: metadata and every tensor's bits (the header's key order may vary)."""
    from safetensors import safe_open

    with safe_open(str(a), framework="pt") as fa, safe_open(str(b), framework="pt") as fb:
        return (
            fa.metadata() == fb.metadata()
            and list(fa.keys()) == list(fb.keys())
            and all(torch.equal(fa.get_tensor(k), fb.get_tensor(k)) for k in fa.keys())
        )


def index(root: Path) -> dict[str, str]:
    return json.loads((root / "model.safetensors.index.json").read_text())["weight_map"]


def untimed(report) -> dict:
    d = report.to_dict()
    d.pop("seconds"), d.pop("patch"), d.pop("undo")  # where the patch went: each output's own undo folder
    for layer in d["layers"]:
        layer.pop("seconds")
        for m in layer["matrices"]:
            m.pop("seconds")
    return d


def no_litter(parent: Path, name: str) -> bool:
    return (
        not (parent / name).exists()
        and not (parent / f"{name}.undo").exists()
        and not any(p.name.startswith(f".{name}.") for p in parent.iterdir())
    )


def by_kind(name: str) -> str:
    return "attention" if ".self_attn." in name else "mlp"


@pytest.mark.parametrize(
    "options",
    [
        {"rank": 3},
        {"energy": 0.8, "rows": True, "method": "svd", "scale": 0.5},
        {"rank": 2, "rule": "top", "top": 2, "retain": None},
        {"rank": 2, "groups": by_kind, "method": "cpqr-sketch", "seed": 3},
    ],
)
def test_streamed_erase_equals_in_memory_file_for_file(sharded, tmp_path, options):
    src, tf, tr = sharded
    options = {"retain": tr, **options}
    before = files(src)
    mem = erase_checkpoint(src, tf, tmp_path / "mem", **options)
    streamed = st.stream_erase_checkpoint(src, tf, tmp_path / "str", progress=False, **options)
    assert files(src) == before  # the input is never modified
    a, b = files(tmp_path / "mem"), files(tmp_path / "str")
    assert a.keys() == b.keys() and "undo_patch.safetensors" not in a  # the patch is kept apart, in <out>.undo
    for name in a:  # every shard, the index, even the plot: the same bytes
        if name not in ("erase_report.json", "undo_patch.safetensors"):
            assert a[name] == b[name], name
    assert same_content(
        tmp_path / "mem.undo" / "undo_patch.safetensors", tmp_path / "str.undo" / "undo_patch.safetensors"
    )
    assert untimed(mem) == untimed(streamed)
    assert (mem.undo["folder"], streamed.undo["folder"]) == ("mem.undo", "str.undo")
    assert streamed.patch_path == str((tmp_path / "str.undo" / "undo_patch.safetensors").resolve())
    # exactly the shards holding an edited tensor were rewritten; the others are hard links
    edited = {m.name for row in streamed.layers for m in row.matrices}
    assert edited and edited <= set(index(src))
    touched = {index(src)[n] for n in edited}
    assert 1 < len(touched) and (len(touched) < len(set(index(src).values())) or "groups" in options)
    for shard in set(index(src).values()):
        same_inode = os.stat(src / shard).st_ino == os.stat(tmp_path / "str" / shard).st_ino
        assert same_inode == (shard not in touched), shard
        if shard not in touched:
            assert before[shard] == b[shard]
    new = {k: v for s in touched for k, v in load_file(str(tmp_path / "str" / s)).items()}
    old = {k: v for s in touched for k, v in load_file(str(src / s)).items()}
    assert {k for k in new if not torch.equal(new[k], old[k])} == edited  # untouched tensors keep their bits


def test_no_hardlink_copies_and_restore_gives_the_original_bits(sharded, tmp_path):
    src, tf, tr = sharded
    out = tmp_path / "erased"
    st.stream_erase_checkpoint(src, tf, out, retain=tr, rank=3, hardlink=False, progress=False)
    shards = set(index(src).values())
    assert all(os.stat(src / s).st_ino != os.stat(out / s).st_ino for s in shards)
    assert files(out)[sorted(shards)[0]] == files(src)[sorted(shards)[0]]  # copied, same bytes
    back = tmp_path / "back"
    st.stream_restore_checkpoint(out, back, progress=False)
    assert files(back) == files(src)  # file for file, byte for byte; no patch/report/plot left over
    # the patch format is shared: the in-memory restore reads a streamed erase too
    restore_checkpoint(out, tmp_path / "back-mem")
    assert all(
        torch.equal(load_file(str(tmp_path / "back-mem" / s))[k], v)
        for s in shards
        for k, v in load_file(str(src / s)).items()
    )
    with pytest.raises(ValueError, match="not the ones this patch produced"):  # patch vs the original weights
        st.stream_restore_checkpoint(
            src, tmp_path / "bad", patch=tmp_path / "erased.undo" / "undo_patch.safetensors", progress=False
        )
    assert no_litter(tmp_path, "bad")


def test_cli_streams_by_default_and_no_stream_agrees(sharded, tmp_path):
    src, tf, tr = sharded
    runner = CliRunner()
    for flag, name in (("--stream", "s"), ("--no-stream", "m")):
        res = runner.invoke(
            app,
            [
                "erase",
                "--model",
                str(src),
                "--forget",
                str(tf),
                "--retain",
                str(tr),
                "--out",
                str(tmp_path / name),
                "--rank",
                "3",
                flag,
            ],
        )
        assert res.exit_code == 0, res.output
    a, b = files(tmp_path / "s"), files(tmp_path / "m")
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in set(index(src).values()))
    assert same_content(tmp_path / "s.undo" / "undo_patch.safetensors", tmp_path / "m.undo" / "undo_patch.safetensors")
    assert not any((tmp_path / name / "undo_patch.safetensors").exists() for name in ("s", "m"))
    linked = [s for s in set(index(src).values()) if os.stat(src / s).st_ino == os.stat(tmp_path / "s" / s).st_ino]
    assert linked  # the default streams and links
    res = runner.invoke(app, ["restore", "--model", str(tmp_path / "s"), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert files(tmp_path / "r") == files(src)


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("what", ["erase", "restore"])
def test_interrupted_run_leaves_no_output_and_no_litter(sharded, tmp_path, monkeypatch, exc, what):
    src, tf, tr = sharded
    erased = tmp_path / "erased"
    st.stream_erase_checkpoint(src, tf, erased, retain=tr, rank=3, progress=False)
    write, calls = st._write_shard, []

    def dying_writer(tensors, path, metadata):
        calls.append(path.name)
        if len(calls) == 2:
            raise exc("killed mid-way")
        write(tensors, path, metadata)

    monkeypatch.setattr(st, "_write_shard", dying_writer)
    before = files(src), files(erased)
    out = tmp_path / "out"
    with pytest.raises(exc, match="killed mid-way"):
        if what == "erase":
            st.stream_erase_checkpoint(src, tf, out, retain=tr, rank=3, progress=False)
        else:
            st.stream_restore_checkpoint(erased, out, progress=False)
    assert len(calls) == 2  # it did die after writing a shard
    assert no_litter(tmp_path, "out")
    assert (files(src), files(erased)) == before


def test_one_shard_and_at_most_two_task_matrices_resident(sharded, tmp_path, monkeypatch):
    src, tf, tr = sharded
    forget_names = list(load_task_matrices(tf))
    live_shards: list[weakref.ref] = []
    loaded: list[str] = []
    load_shard = st._load_shard

    def spy_shard(root, shard):
        assert not [r for r in live_shards if r() is not None], "a previous shard is still in memory"
        loaded.append(shard)
        tensors = load_shard(root, shard)
        live_shards.extend(weakref.ref(t) for t in tensors.values())
        return tensors

    live_tasks: list[weakref.ref] = []
    reads: list[tuple[str, str]] = []
    getitem = LazyTaskMatrices.__getitem__

    def spy_task(self, key):
        alive = [r for r in live_tasks if r() is not None]
        assert len(alive) <= 1, f"{len(alive)} task matrices resident while reading {key}"
        t = getitem(self, key)
        live_tasks.append(weakref.ref(t))
        reads.append((self.path.name, key))
        return t

    monkeypatch.setattr(st, "_load_shard", spy_shard)
    monkeypatch.setattr(LazyTaskMatrices, "__getitem__", spy_task)
    report = st.stream_erase_checkpoint(src, tf, tmp_path / "out", retain=tr, rank=3, progress=False)
    edited = {m.name for row in report.layers for m in row.matrices}
    assert sorted(loaded) == sorted({index(src)[n] for n in edited})  # untouched shards are never read
    forget_reads = [k for f, k in reads if f == "forget"]
    n = len(forget_names)
    assert forget_reads[:n] == forget_names  # the energy pass: each once, in order
    assert sorted(forget_reads[n:]) == sorted(edited)  # then each edited one again, shard by shard
    assert sorted(k for f, k in reads if f == "retain.safetensors") == sorted(edited)  # retain: edited only


@pytest.mark.parametrize(
    "case, error, match",
    [
        ("shape", ValueError, "shape"),
        ("name", KeyError, "no erasable parameter"),
        ("retain", KeyError, "retain task matrices have no entry"),
        ("rank", ValueError, "exceeds min"),
        ("nan", ValueError, "NaN or Inf"),
    ],
)
def test_bad_input_fails_like_in_memory_before_any_shard_is_read(sharded, tmp_path, monkeypatch, case, error, match):
    src, _, _ = sharded
    model = tiny_llama()
    tf, tr = block_task_matrices(model, hot=2, seed=1), block_task_matrices(model, hot=0, seed=2)
    rank = 3
    if case == "shape":  # in a layer that would not even be edited
        tf["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    elif case == "name":
        tf["model.layers.9.mlp.up_proj.weight"] = torch.zeros(3, 3)
    elif case == "retain":
        del tr["model.layers.1.self_attn.q_proj.weight"]
    elif case == "rank":
        rank = 10_000
    else:
        tf["model.layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    f = save_task_matrices(tmp_path / "f.safetensors", tf)
    r = save_task_matrices(tmp_path / "r.safetensors", tr)
    with pytest.raises(error, match=match):
        erase_checkpoint(src, f, tmp_path / "mem", retain=r, rank=rank)
    monkeypatch.setattr(st, "_load_shard", lambda *a: pytest.fail("a shard was read before validation"))
    with pytest.raises(error, match=match):
        st.stream_erase_checkpoint(src, f, tmp_path / "out", retain=r, rank=rank, progress=False)
    assert no_litter(tmp_path, "out")


def test_output_path_and_option_checks(sharded, tmp_path):
    src, tf, _ = sharded
    with pytest.raises(TypeError, match="unknown erase option.*ranks"):
        st.stream_erase_checkpoint(src, tf, tmp_path / "o", ranks=2, progress=False)
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        st.stream_erase_checkpoint(src, tf, tmp_path / "exists", rank=2, progress=False)
    with pytest.raises(ValueError, match="must differ"):
        st.stream_erase_checkpoint(src, tf, src, rank=2, progress=False, overwrite=True)
    with pytest.raises(FileNotFoundError, match="not found"):
        st.stream_erase_checkpoint(tmp_path / "nope", tf, tmp_path / "o", rank=2, progress=False)


def test_conv_kernels_and_expert_stacks_in_two_shards(tmp_path):
    model = ConvExperts()
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    src = tmp_path / "model"
    src.mkdir()
    names = sorted(sd)
    halves = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2 :]}
    for shard, part in halves.items():
        save_file({n: sd[n] for n in part}, str(src / shard), metadata={"format": "pt"})
    (src / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {n: s for s, part in halves.items() for n in part}})
    )
    g = torch.Generator().manual_seed(0)
    tf = save_task_matrices(
        tmp_path / "f.safetensors", {n: torch.randn(p.shape, generator=g) for n, p in sd.items() if p.dim() == 3}
    )
    mem = erase_checkpoint(src, tf, tmp_path / "mem", rank=2, localize=False)
    streamed = st.stream_erase_checkpoint(src, tf, tmp_path / "str", rank=2, localize=False, progress=False)
    assert untimed(mem) == untimed(streamed)
    assert "experts.1.gate_up_proj[3]" in {m.name for row in streamed.layers for m in row.matrices}
    a, b = files(tmp_path / "mem"), files(tmp_path / "str")
    assert all(a[k] == b[k] for k in halves)
    st.stream_restore_checkpoint(tmp_path / "str", tmp_path / "back", progress=False)
    assert all(files(tmp_path / "back")[k] == files(src)[k] for k in halves)


def test_task_matrices_open_lazily_from_file_directory_or_sharded_index(tmp_path):
    g = torch.Generator().manual_seed(0)
    tm = {f"m.layers.{i}.{w}.weight": torch.randn(4, 3, generator=g) for i in range(3) for w in ("q", "k")}
    single = save_task_matrices(tmp_path / "one.safetensors", tm, {"kind": "test"})
    by_group = save_by_group(tmp_path / "dir", tm)
    names = list(tm)
    (tmp_path / "sh").mkdir()
    save_file({n: tm[n] for n in names[:4]}, str(tmp_path / "sh" / "t-00001-of-00002.safetensors"))
    save_file({n: tm[n] for n in names[4:]}, str(tmp_path / "sh" / "t-00002-of-00002.safetensors"))
    idx = tmp_path / "sh" / "t.safetensors.index.json"
    idx.write_text(
        json.dumps({"weight_map": {n: f"t-0000{1 + (i >= 4)}-of-00002.safetensors" for i, n in enumerate(names)}})
    )
    for path in (single, by_group, idx):
        lazy, eager = open_task_matrices(path), load_task_matrices(path)
        assert list(lazy) == list(eager) and sorted(lazy) == sorted(tm)  # one order for both readers
        assert all(torch.equal(lazy[k], tm[k]) and lazy.shape(k) == (4, 3) for k in tm)
    assert open_task_matrices(single).meta == {"kind": "test"}
    idx.write_text(json.dumps({"weight_map": {names[0]: "missing.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        open_task_matrices(idx)
    save_file({names[0]: tm[names[0]]}, str(by_group / "zz.safetensors"))
    with pytest.raises(ValueError, match="appears twice"):
        open_task_matrices(by_group)


def test_stream_benchmark_runs_end_to_end_on_a_tiny_architecture(tmp_path):
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "stream",
            "--arch",
            "tiny",
            "--shard-mb",
            "0.2",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(out),
            "--threads",
            "1",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["identical"] and data["shards"] >= 3 and data["largest_shard"] <= 0.2e6 + 64 * 1000 * 2
    assert {r["path"] for r in data["rows"]} == {"stream", "in-memory"}
    assert all(r["peak_rss"] >= r["baseline_rss"] > 0 and r["seconds"] > 0 for r in data["rows"])
    assert not list((tmp_path / "w").iterdir())  # the generated checkpoint is deleted
