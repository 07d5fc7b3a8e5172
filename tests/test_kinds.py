"""The model-kind registry (mmunlearn.kinds): registration, lookup, folder detection, and that the code outside the
adapters asks a kind's capabilities instead of comparing kind names."""

import ast
import inspect
import json
from pathlib import Path

import pytest

from mmunlearn.data.utterances import LEVELS
from mmunlearn.kinds import Kind, get_kind, kind_names, kind_of, kinds, read_small_json, register_kind
from tests.speech_corpus import speaker_manifests  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[1]


def test_the_built_in_kinds_are_registered_in_detection_order():
    assert kind_names() == ("speaker", "hf-audio", "speech-llm", "text")  # the catch-all (any config.json) last
    speaker, text = get_kind("speaker"), get_kind("text")
    assert speaker.has_batchnorm and speaker.train_in_eval_mode and speaker.is_classifier and speaker.weight_files
    assert not (text.takes_audio or text.is_classifier or text.train_in_eval_mode or text.weight_files)
    with pytest.raises(ValueError, match="unknown model kind 'vision'; choose one of"):
        get_kind("vision")


def test_a_name_is_taken_by_one_module_and_sizes_are_checked():
    def load(folder, **_):
        return folder

    with pytest.raises(ValueError, match="already registered"):
        register_kind(
            Kind(
                "speaker",
                detect=lambda f: False,
                load=load,
                sizes=("s",),
                default_size="s",
                description="another speaker kind",
            )
        )
    with pytest.raises(ValueError, match="default size 'm' is not one of"):
        Kind("x", detect=lambda f: False, load=load, sizes=("s",), default_size="m", description="x")
    for io in ({}, {"read_weights": dict}, {"write_weights": print}):
        with pytest.raises(ValueError, match="need read_weights and write_weights"):
            Kind(
                "x",
                detect=lambda f: False,
                load=load,
                sizes=("s",),
                default_size="s",
                description="x",
                weight_files=("w.ckpt",),
                **io,
            )


def test_detection_reads_names_and_small_json_only(tmp_path):
    assert kind_of(tmp_path) is None and kind_of(tmp_path / "missing") is None
    (tmp_path / "hyperparams.yaml").write_text("anything")
    assert kind_of(tmp_path).name == "speaker"
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "qwen2_audio"}))
    assert kind_of(other).name == "speech-llm"
    (other / "config.json").write_text(
        json.dumps({"architectures": ["WavLMForXVector", "HubertForSequenceClassification"]})
    )
    assert kind_of(other).name == "hf-audio"
    (other / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    assert kind_of(other).name == "text"
    (other / "config.json").write_text("[" * 100_000 + "]" * 100_000)  # nested too deeply for json: not detected
    assert read_small_json(other / "config.json") is None and kind_of(other).name == "text"
    (other / "config.json").write_text(json.dumps({"model_type": "qwen2_audio", "pad": "x" * (1 << 20)}))
    assert read_small_json(other / "config.json") is None  # over the size a detector reads


def _kind_literal_comparisons(path: Path, strict: bool = False) -> list[str]:
    """``<...kind...> ==/!=/in <kind name literal(s)>`` in one file. ``strict`` (the recipes, whose ``--model`` values
    are kind names too): also a side naming a model (``cfg.model == "hf-audio"``), and any comparison with a kind name
    that is not also a level name (``which == "speech-llm"``; ``level == "speaker"`` is the level)."""
    names = set(kind_names())
    words = ("kind", "model") if strict else ("kind",)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        about_kind = any(w in ast.unparse(s).lower() for s in sides if not isinstance(s, ast.Constant) for w in words)
        literals = {c.value for s in sides for c in ast.walk(s) if isinstance(c, ast.Constant)}
        if (about_kind and literals & names) or (strict and literals & (names - set(LEVELS))):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_adapters_compares_kind_names():
    """Kind knowledge lives in the adapter that registers the kind (mmunlearn/adapters/) and the registry: the rest of
    the package, the recipes and data_prep ask a kind's capabilities (``has_batchnorm``, ``is_classifier``, ...)."""
    files = [
        p
        for d in ("mmunlearn", "recipes", "data_prep")
        for p in (ROOT / d).rglob("*.py")
        if "adapters" not in p.parts and p.name != "kinds.py"
    ]
    found = [hit for p in files for hit in _kind_literal_comparisons(p, strict=p.is_relative_to(ROOT / "recipes"))]
    assert len(files) > 100 and found == []


def test_the_scan_finds_kind_comparisons_and_skips_others(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        'def f(ctx, kind, level):\n    a = ctx.kind != "speaker" or kind in ("text", "speech-llm")\n'
        '    return a or level == "speaker" or kind == "finetune"\n'
    )
    assert len(_kind_literal_comparisons(sample)) == 2
    recipe = tmp_path / "recipe.py"  # the recipes' --model switches (voxceleb2 before they asked the kind)
    recipe.write_text(
        'def g(cfg, model, which, level):\n    a = cfg.model == "speech-llm" or model != "hf-audio"\n'
        '    b = self.model == "speaker" or which in ("hf-audio",) or cfg.model == "classifier"\n'
        '    return a or b or level == "speaker" or level != "sample" or cfg.where == "audio"\n'
    )
    assert len(_kind_literal_comparisons(recipe)) == 0
    assert [hit.split(": ", 1)[1] for hit in _kind_literal_comparisons(recipe, strict=True)] == [
        "cfg.model == 'speech-llm'",
        "model != 'hf-audio'",
        "self.model == 'speaker'",
        "which in ('hf-audio',)",
    ]


def _methods(protocol: type) -> set[str]:
    """The methods a protocol declares, its bases' included (data members are instance attributes: not checked)."""
    return {
        name
        for klass in protocol.__mro__
        if klass not in (object,) and getattr(klass, "_is_protocol", False)
        for name, value in vars(klass).items()
        if callable(value) and not name.startswith("_")
    }


def test_every_kinds_adapter_implements_the_whole_protocol():
    from mmunlearn.adapters.base import ClassifierAdapter, ModalityAdapter, TokenAdapter

    base = _methods(ModalityAdapter)
    assert {"clone", "with_model", "groups", "answer_nll", "bf16_generation", "save"} <= base
    assert _methods(ClassifierAdapter) - base >= {"predict", "nll", "embeddings", "logits_and_embeddings"}
    for kind in kinds():
        assert kind.adapter is not None, kind.name
        protocol = ClassifierAdapter if kind.is_classifier else TokenAdapter
        missing = sorted(m for m in _methods(protocol) if not callable(getattr(kind.adapter, m, None)))
        assert missing == [], (kind.name, missing)


def test_every_classifier_kind_names_a_trainer_that_builds_its_kind():
    """Each built-in classifier kind names a trainer module with the whole TRAINER_API, whose training settings are
    a TrainConfig per size and whose description names the architecture; a kind naming none has no trainer."""
    from mmunlearn.kinds import TRAINER_API
    from mmunlearn.train import TrainConfig

    classifiers = [k for k in kinds() if k.is_classifier]
    assert classifiers and all(k.trainer is not None for k in classifiers)
    for kind in classifiers:
        module = kind.trainer_module()
        assert all(callable(getattr(module, n)) for n in TRAINER_API)
        for size in kind.sizes:
            assert isinstance(module.train_config(size), TrainConfig)
            assert module.train_config(size, epochs=3, lr=1e-4).epochs == 3
        assert isinstance(module.describe(kind.sizes[0])["architecture"], str)
    with pytest.raises(ValueError, match="names no trainer"):
        next(k for k in kinds() if not k.is_classifier).trainer_module()


def _protocol_members() -> set[str]:
    """Every member name the adapter protocols declare: methods and data members (annotations), bases included."""
    from mmunlearn.adapters.base import ClassifierAdapter, TokenAdapter

    names = _methods(TokenAdapter) | _methods(ClassifierAdapter)
    return names | {
        name
        for protocol in (TokenAdapter, ClassifierAdapter)
        for klass in protocol.__mro__
        if getattr(klass, "_is_protocol", False)
        for name in inspect.get_annotations(klass)
    }


def _member_probes(path: Path, members: set[str]) -> list[str]:
    """``getattr(x, "<member>", ...)`` and ``hasattr(x, "<member>")`` in one file, for a name in ``members``."""
    return [
        ast.unparse(node)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in members
    ]


#: probes of a protocol member's name on objects that are not adapters (a transformers output)
NOT_ADAPTERS = {
    ("mmunlearn/tilt/model.py", "getattr(out, 'hidden_states', None)"),
    ("mmunlearn/methods/prefix_states.py", "getattr(cache, 'layers', None)"),
}  # a transformers KV cache


def test_no_caller_probes_for_a_member_the_adapter_protocol_declares():
    """What mmunlearn/adapters/base.py's protocols declare is called directly (an optional part has its default in
    AdapterDefaults / TokenScoring, a classifier-only member is read when the kind ``is_classifier``): outside
    adapters/, no getattr/hasattr names a protocol member, bar the listed probes of non-adapter objects."""
    members = _protocol_members()
    assert {"index", "embedding_output", "tokenizer", "eos_id", "precision", "groups", "bf16_generation"} <= members
    files = [
        p for d in ("mmunlearn", "recipes", "data_prep") for p in (ROOT / d).rglob("*.py") if "adapters" not in p.parts
    ]
    found = {(p.relative_to(ROOT).as_posix(), call) for p in files for call in _member_probes(p, members)}
    assert len(files) > 100 and sorted(found - NOT_ADAPTERS) == []
    assert NOT_ADAPTERS <= found, f"no longer there, drop from NOT_ADAPTERS: {sorted(NOT_ADAPTERS - found)}"


def test_the_probe_scan_finds_member_names_and_skips_others(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        'def f(adapter, cfg, name):\n    a = getattr(adapter, "index", None) or hasattr(adapter, "eos_id")\n'
        '    return a, getattr(cfg, "sweep_first", None), getattr(adapter, name), adapter.tokenizer\n'
    )
    assert _member_probes(sample, _protocol_members()) == [
        "getattr(adapter, 'index', None)",
        "hasattr(adapter, 'eos_id')",
    ]


def test_the_default_answer_nll_of_a_classifier_is_its_per_utterance_nll(speaker_manifests):  # noqa: F811
    """AdapterDefaults.answer_nll (what mean_nll and the sweep rule read) equals the classifier's own NLL."""
    import torch

    from mmunlearn.adapters.speaker.adapter import SpeakerAdapter
    from mmunlearn.data.utterances import split_rows
    from mmunlearn.methods import mean_nll

    rows = split_rows(speaker_manifests, "train")[:6]
    adapter = SpeakerAdapter.build(
        sorted({r["spk_id"] for r in split_rows(speaker_manifests, "train")}), preset="tiny", device="cpu", seed=0
    )
    adapter.model.eval()
    per_item = adapter.answer_nll(rows, batch_size=4)
    with torch.no_grad():
        direct = adapter.nll(adapter.collate(rows)).double()
    assert per_item.shape == (len(rows),) and torch.allclose(per_item, direct, atol=1e-5)
    assert mean_nll(adapter, rows) == pytest.approx(float(direct.mean()), abs=1e-5)
    with pytest.raises(ValueError, match="answers="):
        adapter.answer_nll(rows, answers=["x"] * len(rows))


def test_a_method_applies_to_the_kinds_its_config_has_rows_for_or_any_registered_kind_it_names():
    from dataclasses import dataclass

    from mmunlearn.config import PresetConfig
    from mmunlearn.methods.base import REGISTRY, get, register

    @dataclass
    class Rows(PresetConfig):
        PRESETS = {("speaker", "tiny"): {}, ("text", "micro"): {}}

    try:
        assert register("rows-only", Rows, lambda *a: None).kinds == ("speaker", "text")
        assert get("rows-only", "hf-audio") is REGISTRY["rows-only"]  # hf-audio takes the speaker rows
        with pytest.raises(ValueError, match="does not apply to a speech-llm model"):
            get("rows-only", "speech-llm")
        assert register("hf-only", Rows, lambda *a: None, kinds=("hf-audio",)).applies_to("hf-audio")
        with pytest.raises(ValueError, match=r"unknown model kinds \['vision'\]"):
            register("nowhere", Rows, lambda *a: None, kinds=("vision",))
        assert "nowhere" not in REGISTRY
    finally:
        for name in ("rows-only", "hf-only", "nowhere"):
            REGISTRY.pop(name, None)


def test_a_presets_row_is_the_kinds_own_size_or_its_largest():
    for kind in kinds():
        assert [kind.size_for(s) for s in kind.sizes] == list(kind.sizes)
        assert kind.size_for("/models/my-checkpoint") == kind.sizes[-1]
    assert get_kind("text").size_for("smollm2-135m") == "model_dir" and get_kind("text").size_for("mini") == "mini"
    assert get_kind("speaker").size_for("base") == get_kind("hf-audio").size_for("base") == "large"
    assert get_kind("speech-llm").size_for("tiny") == "tiny"


#: calls whose argument names a model kind
KIND_ARGUMENT_CALLS = {"names", "needing", "config_for", "get_kind", "for_preset"}


def _kind_literal_arguments(path: Path) -> list[str]:
    """Calls in one file that pass a registered kind's name as a literal: ``kind=``/``model_kind=`` keywords, any
    argument of :data:`KIND_ARGUMENT_CALLS`, or of a bare ``get(method, kind)`` (the method registry's; ``d.get`` is
    not one) (a recipe takes its kind from the adapter module, ``KIND.name``)."""
    names, found = set(kind_names()), []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        args = [k.value for k in node.keywords if k.arg in ("kind", "model_kind")]
        args += list(node.args) if func in KIND_ARGUMENT_CALLS else []
        args += list(node.args) if func == "get" and isinstance(node.func, ast.Name) else []
        if any(isinstance(a, ast.Constant) and a.value in names for a in args):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_no_module_outside_the_adapters_passes_a_kind_name_literal():
    files = [
        p
        for d in ("mmunlearn", "recipes", "data_prep")
        for p in (ROOT / d).rglob("*.py")
        if "adapters" not in p.parts and p.name != "kinds.py"
    ]
    assert [hit for p in files for hit in _kind_literal_arguments(p)] == []


def test_the_argument_scan_finds_kind_literals_and_skips_others(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        'def f(get, KIND):\n    a = get("rmu").config_for("text", "mini"), names("speaker")\n'
        '    b = run(kind="speech-llm"), run(kind=KIND.name), names(KIND.name), split("speaker")\n'
        '    return a, b, audit(model_kind="hf-audio"), level_rows(level="speaker")\n'
        'c = get("grad_diff", "speech-llm"), get("grad_diff", KIND.name), row.get("m", "speaker")\n'
    )
    assert sorted(hit.split(": ")[0] for hit in _kind_literal_arguments(sample)) == [
        "sample.py:2",
        "sample.py:2",
        "sample.py:3",
        "sample.py:4",
        "sample.py:5",
    ]
