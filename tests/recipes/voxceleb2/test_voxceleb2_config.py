"""VoxCeleb2 recipe config (no model work): YAML + options + KEY=VALUE layers typed by VoxCelebConfig's fields, the
method knobs and per-method settings a method gets, and bad settings refused by name before anything is built."""

import pytest
from typer.testing import CliRunner

from recipes.recipe_config import ConfigError, build_config
from recipes.voxceleb2 import pipeline as pipe
from recipes.voxceleb2.cli import app
from recipes.voxceleb2.config import VoxCelebConfig
from recipes.voxceleb2.settings import MODEL_ALIASES, SWEEP_SCOPES, models, scopes_for


def _build(**layers):
    return build_config(VoxCelebConfig, kind=None, **layers)


def _refused(*args: str) -> str:
    """The usage error of a command line, unwrapped from its box (one line, single spaces)."""
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 2, res.output
    return " ".join(res.output.replace("\u2502", " ").split())


def test_yaml_then_options_then_overrides_each_typed(tmp_path):
    path = tmp_path / "vox.yaml"
    path.write_text(
        "methods: qr-erase, grad_diff\nsweep: false\nsweep_ranks: [1, 3]\nretain_bound: 1\n"
        "speakers: 6\nmethod_options:\n  grad_diff: {lr: 0.5, weight_decay: 0.1}\n"
    )
    cfg = _build(
        file=path,
        given={"speakers": 8},
        overrides=["sweep=yes", "max_trials=0", "method.grad_diff.lr=0.25"],
        method_settings=["qr-erase.extract_steps=7"],
    )
    assert cfg.methods == ("qr-erase", "grad_diff") and cfg.chosen() == ["qr-erase", "grad_diff"]
    assert (cfg.sweep, cfg.speakers, cfg.max_trials, cfg.sweep_ranks) == (True, 8, 0, (1, 3))
    assert cfg.retain_bound == 1.0 and isinstance(cfg.retain_bound, float)
    assert cfg.method_options == {"grad_diff": {"lr": 0.25, "weight_decay": 0.1}, "qr-erase": {"extract_steps": 7}}
    # the shared knobs reach every method whose config has them, a method's own settings only that method
    cfg = _build(overrides=["epochs=3", "rank=2", "method.grad_diff.lr=0.5"])
    assert cfg.method_overrides("grad_diff") == {"epochs": 3, "seed": 0, "lr": 0.5}
    assert cfg.method_overrides("qr-erase")["rank"] == 2 and "lr" not in cfg.method_overrides("qr-erase")


def test_defaults_are_the_commands_and_all_follows_the_model():
    cfg = _build()
    assert (cfg.methods, cfg.sweep, cfg.resolved_retain_bound(), cfg.max_trials, cfg.preset) == (
        ("qr-erase",),
        True,
        0.05,
        20000,
        "small",
    )
    # retain_bound unset: each model's rule has its own default (a speech LLM's NLL rule: 0.1 nat); set, it is used
    assert cfg.retain_bound is None and _build(overrides=["model=speech-llm"]).resolved_retain_bound() == 0.1
    assert _build(overrides=["model=speech-llm", "retain_bound=0.3"]).resolved_retain_bound() == 0.3
    assert cfg.resolved_scope() == "sweep" and _build(overrides=["sweep=no"]).resolved_scope() == "all"
    assert "t3" not in _build(overrides=["methods=all"]).chosen()
    llm = _build(overrides=["methods=all", "model=speech-llm", "method.t3.temperature=2"])
    assert "t3" in llm.chosen() and llm.method_options == {"t3": {"temperature": 2.0}}


def test_every_classifier_kind_takes_ecapas_scopes_and_default():
    """hf-audio's scopes are ECAPA's (its adapter exposes head_weight and a settable scope): with --sweep the rule
    tries the head first; the speech LLM's path is chosen by its kind (not a classifier), not by its name."""
    for model in ("classifier", "hf-audio"):
        cfg = _build(overrides=[f"model={model}"])
        assert cfg.kind.is_classifier and cfg.resolved_scope() == "sweep"
        assert scopes_for("qr-erase", cfg.resolved_scope(), cfg.sweep)[0] == SWEEP_SCOPES[0] == "head"
        assert _build(overrides=[f"model={model}", "sweep=no"]).resolved_scope() == "all"
        for scope in ("head", "embedding", "all"):
            assert _build(overrides=[f"model={model}", f"scope={scope}"]).resolved_scope() == scope
    assert not _build(overrides=["model=speech-llm"]).kind.is_classifier
    assert models()[: len(MODEL_ALIASES)] == tuple(MODEL_ALIASES) and {"hf-audio", "speech-llm"} <= set(models())
    for model in models():  # every classifier --model builds its models with its kind's trainer; the others refuse
        kind = _build(overrides=[f"model={model}"]).kind
        if kind.is_classifier:
            assert pipe.family(model).kind == kind.name and pipe.family(model).unprefixed == (model in MODEL_ALIASES)
        else:
            with pytest.raises(ValueError, match="not a classifier kind"):
                pipe.family(model)


@pytest.mark.parametrize(
    "overrides, key, message",
    [
        (["nope=1"], "nope", "valid settings: audit, audit_attacks,"),
        (["speakers=1"], "speakers", "at least 2"),
        (["forget_fraction=0.7"], "forget_fraction", "between 0.0 and 0.5"),
        (["max_trials=-1"], "max_trials", "at least 0"),
        (["methods=t3"], "methods", "inapplicable methods ['t3'] for --model classifier"),
        (["methods=all,kl"], "methods", "inapplicable"),
        (["model=wavlm"], "model", "classifier, hf-audio, speech-llm"),
        (["where=vision"], "where", "audio, text, both"),
        (["extract=lora"], "extract", "does not work on the speaker classifier"),
        (["sweep_ranks=0,2"], "sweep_ranks", "positive integers"),
        (["scope=sweep", "sweep=no"], "scope", "needs --sweep"),
        (["model=hf-audio", "scope=sweep", "sweep=no"], "scope", "needs --sweep"),
        (["audit=yes", "audit_attacks=rumour"], "audit_attacks", "rumour"),
        (["model=speech-llm", "audit=yes"], "audit", "audit a speech-LLM method's output folder"),
        (["method.rmu.steering=8"], "method_options", "['rmu'] not applicable to --model classifier"),
        (["method.grad_ascent.nope=1"], "method_options", "settings of grad_ascent: alpha"),
        (["method.nothing.lr=1"], "method_options", "unknown method 'nothing'; choose from"),
        (["epochs=many"], "epochs", "expected int or none"),
        (["model=speech-llm", "extract=sideways"], "extract", "finetune, lora, gradient, layerwise"),
        (["model=speech-llm", "extract=lora"], "extract", "cannot wrap the audio tower's convolutions (where=both)"),
        (
            ["model=speech-llm", "scope=head"],
            "scope",
            "scope does not apply to --model speech-llm (the speech LLM's edits are chosen by --where); leave it unset",
        ),
        (["model=speech-llm", "forget_acc=0.5"], "forget_acc", "does not apply to --model speech-llm"),
        (["model=speech-llm", "preset=tiny"], "preset", "the speech LLM is --llm"),
        (["where=audio"], "where", "where does not apply to --model classifier (a setting of --model speech-llm)"),
        (["model=hf-audio", "retrained=runs/x"], "retrained", "does not apply to --model hf-audio"),
    ],
)
def test_bad_settings_are_errors_naming_the_setting(overrides, key, message):
    with pytest.raises(ConfigError) as err:
        _build(overrides=overrides)
    assert message in str(err.value) and err.value.key == key


def test_an_unknown_key_is_a_usage_error_before_any_work(tmp_path):
    path = tmp_path / "vox.yaml"
    path.write_text("methods: grad_ascent\nlevel: sample\n")  # the level is the command, not a setting
    message = _refused("speaker", "--workdir", str(tmp_path / "w"), "--config", str(path))
    assert "unknown setting 'level' (in " in message and "valid settings: audit," in message
    assert "unknown setting 'retain_bund' (override)" in _refused(
        "sample", "--workdir", str(tmp_path / "w"), "retain_bund=0.1"
    )
    assert "write KEY=VALUE" in _refused("speaker", "--workdir", str(tmp_path / "w"), "--method-option", "kl.lr")
    assert not (tmp_path / "w").exists()  # refused before the corpus is built


def _speech_llm_call(cfg, monkeypatch, tmp_path) -> dict:
    """What the speech-LLM level run (recipes.voxceleb2.speech_llm.run_level) passes on for ``cfg``: the keywords of
    its run, the corpus sizes and the models' seed (nothing built or run)."""
    from recipes.voxceleb2 import speech_llm

    seen: dict = {}

    def corpus(path, seed, progress, **sizes):
        seen["corpus_options"] = sizes
        return tmp_path / "manifests"

    def model(manifests, role, **opts):
        seen["seed"] = opts["seed"]
        return tmp_path / role

    monkeypatch.setattr(speech_llm, "make_corpus", corpus)
    monkeypatch.setattr(speech_llm, "build_model", model)
    monkeypatch.setattr(speech_llm, "run", lambda manifests, model_dir, out, **kw: seen.update(kw) or [])
    speech_llm.run_level("speaker", cfg, "cpu")
    return seen


def test_the_speech_llm_path_is_given_every_setting_it_takes(monkeypatch, tmp_path):
    """retain_bound, lr, epochs, extract and resume (and the other knobs, the corpus sizes, strict) reach the
    speech-LLM run's call (recipes.voxceleb2.speech_llm.run_level); the settings it has no use for are refused
    (test_bad_settings_are_errors_naming_the_setting; every setting: tests/recipes/core/test_settings_reach.py)."""
    from mmunlearn.config import applicable_overrides
    from mmunlearn.methods import get
    from recipes.voxceleb2.config import CLASSIFIER_ONLY

    default = _speech_llm_call(_build(overrides=["model=speech-llm"]), monkeypatch, tmp_path)
    assert (default["retain_bound"], default["resume"]) == (0.1, True)  # the NLL rule's bound; resume as documented
    assert {k: v for k, v in default["options"].items() if v is not None} == {"seed": 0, "extract_seed": 0}
    cfg = _build(
        overrides=[
            "model=speech-llm",
            "where=text",
            "retain_bound=0.3",
            "lr=0.002",
            "epochs=3",
            "extract=lora",
            "resume=no",
            "rank=2",
            "retain_rank=5",
            "scale=2",
            "extract_steps=4",
            "extract_lr=0.1",
            "layer_rule=top",
            "sweep_ranks=1,3",
            "seed=4",
            "speakers=6",
            "utterances=5",
            "videos=2",
            "forget_speakers=1",
            "forget_fraction=0.2",
        ]
    )
    args = _speech_llm_call(cfg, monkeypatch, tmp_path)
    assert (args["retain_bound"], args["resume"], args["seed"]) == (0.3, False, 4)
    assert args["corpus_options"] == dict(speakers=6, utterances=5, videos=2, forget_speakers=1, forget_fraction=0.2)
    erase = get("qr-erase").config_for(
        "speech-llm", "tiny", **applicable_overrides(get("qr-erase").config, args["options"])
    )
    assert (erase.rank, erase.retain_rank, erase.scale, erase.sweep_ranks, erase.layer_rule) == (
        2,
        5,
        2.0,
        (1, 3),
        "top",
    )
    assert (erase.extract.kind, erase.extract.steps, erase.extract.lr) == ("lora", 4, 0.1)
    ascent = get("grad_ascent").config_for(
        "speech-llm", "tiny", **applicable_overrides(get("grad_ascent").config, args["options"])
    )
    assert (ascent.lr, ascent.epochs, ascent.seed) == (0.002, 3, 4)
    assert set(CLASSIFIER_ONLY) == {
        "preset",
        "train_epochs",
        "train_lr",
        "crop_seconds",
        "scope",
        "forget_acc",
        "segment_seconds",
        "max_trials",
        "audit_relearn_steps",
        "audit_relearn_lr",
        "audit_relearn_on",
        "audit_attacks",
    }
