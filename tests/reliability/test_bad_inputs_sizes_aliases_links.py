"""The third hostile-input audit (issue 33), M3-M7 and low items: a sample rate that would allocate gigabytes,
YAML alias bombs and special files as --config, a T3 rank that sizes a huge head, report injection, symlinks
planted where a parallel comparison writes its logs. Each is one error naming the file and what is wrong;
the inputs stay byte-identical and nothing is written outside the output folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mmunlearn.errors import USER_ERRORS, one_line
from tests.reliability.untrusted import digest_tree, listing

SPEAKERS = ["id00001", "id00002"]


def user_error(exc: BaseException, *needles: str) -> str:
    """``exc`` is shown by the CLI as one ``error:`` line holding every needle."""
    assert isinstance(exc, USER_ERRORS), type(exc)
    text = one_line(exc)
    assert "\n" not in str(exc), text
    for needle in needles:
        assert needle in text, (needle, text)
    return text


# ------------------------------------------------------------------------ M3: hf-audio sampling_rate
@pytest.fixture(scope="module")
def hf_master(tmp_path_factory) -> Path:
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor

    from mmunlearn.adapters.hf_audio.adapter import HFAudioAdapter

    cfg = Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        conv_dim=(8, 8),
        conv_kernel=(10, 5),
        conv_stride=(10, 5),
        num_conv_pos_embeddings=4,
        num_conv_pos_embedding_groups=2,
        classifier_proj_size=8,
    )
    fe = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True)
    return HFAudioAdapter.build(cfg, SPEAKERS, fe, device="cpu").save(tmp_path_factory.mktemp("hf") / "model")


@pytest.mark.parametrize("rate", [1e9, 1e12, 0, -16000, 999, "16000", None])
def test_an_hf_audio_sampling_rate_outside_audio_rates_is_one_error_naming_the_file(hf_master, tmp_path, rate):
    import shutil

    import numpy as np
    import soundfile as sf

    from mmunlearn.api.unlearn import unlearn

    (tmp_path / "audio").mkdir()
    for name in ("a", "b"):
        sf.write(tmp_path / "audio" / f"{name}.wav", np.zeros(8000, dtype="float32"), 16000)
    folder = Path(shutil.copytree(hf_master, tmp_path / "model"))
    config = folder / "preprocessor_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "sampling_rate": rate}))
    before = digest_tree(folder)
    with pytest.raises(ValueError) as err:
        unlearn(
            folder,
            forget=[(str(tmp_path / "audio" / "a.wav"), SPEAKERS[0])],
            retain=[(str(tmp_path / "audio" / "b.wav"), SPEAKERS[1])],
            method="grad_ascent",
            out=tmp_path / "out",
            device="cpu",
            progress=False,
            rule=None,
        )
    user_error(err.value, str(config), "sampling_rate", "1000..192000")
    assert digest_tree(folder) == before and listing(tmp_path) == {"model", "audio"}


def test_an_hf_audio_folder_at_an_ordinary_rate_loads(hf_master):
    from mmunlearn.adapters.hf_audio.adapter import HFAudioAdapter

    assert HFAudioAdapter.load(hf_master, device="cpu").sample_rate == 16000  # the control


# ------------------------------------------------------------------------ M4: --config YAML
LAUGHS = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    + [f"{c}: &{c} [{', '.join(['*' + p] * 10)}]" for p, c in zip("abcdefgh", "bcdefghi")]
)


def _tofu_config(path: Path, *overrides: str):
    from recipes.recipe_config import build_config
    from recipes.tofu.config import TofuConfig

    return build_config(TofuConfig, file=path, overrides=overrides)


@pytest.mark.parametrize("where", ["top level", "method option typed Any"])
def test_a_yaml_alias_bomb_in_config_is_refused_before_it_expands(tmp_path, where):
    import time

    from recipes.recipe_config import ConfigError
    from recipes.tofu.config import TofuConfig  # noqa: F401  (imported before the clock starts)

    path = tmp_path / "bomb.yaml"
    body = (
        LAUGHS
        if where == "top level"
        else "method_options:\n  grad_ascent:\n    extra:\n"
        + "\n".join("      " + line for line in LAUGHS.splitlines())
    )
    path.write_text(body)
    assert len(body) < 1000  # 10^9 values once expanded
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        _tofu_config(path)
    assert time.perf_counter() - start < 2  # refused while parsing, not after expanding
    user_error(err.value, str(path), "alias")
    assert path.read_text() == body and listing(tmp_path) == {"bomb.yaml"}


def test_a_config_that_is_a_fifo_or_a_device_is_refused_without_reading(tmp_path):
    from recipes.recipe_config import ConfigError

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # no writer: reading it would wait for ever
    for path in (fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises(ConfigError) as err:
            _tofu_config(path)
        user_error(err.value, str(path), "not a regular file")


def test_a_huge_or_deeply_nested_config_is_one_error(tmp_path):
    from recipes.recipe_config import MAX_CONFIG_BYTES, ConfigError

    big = tmp_path / "big.yaml"
    big.write_text("seed: 1\n" + "#" * MAX_CONFIG_BYTES)
    deep = tmp_path / "deep.yaml"
    deep.write_text("seed: " + "[" * 100_000 + "]" * 100_000)
    for path, needle in ((big, "more than a config may have"), (deep, "nested too deeply")):
        with pytest.raises(ConfigError) as err:
            _tofu_config(path)
        user_error(err.value, str(path), needle)


def test_numbers_written_with_an_exponent_are_floats(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 1e-3\nft_lr: 2E-5\n")
    cfg = _tofu_config(path)
    assert cfg.lr == 1e-3 and cfg.ft_lr == 2e-5
    assert _tofu_config(None, "lr=5e-4").lr == 5e-4  # a KEY=VALUE override too


# ------------------------------------------------------------------------ M7: tofu compare --jobs
def test_jobs_write_their_configs_and_logs_through_no_planted_link(tmp_path):
    from recipes.recipe_config import build_config
    from recipes.tofu.config import TofuConfig
    from recipes.tofu.parallel import JOBS_DIR, run_jobs

    out = tmp_path / "out"
    jobs = out / JOBS_DIR
    jobs.mkdir(parents=True)
    victims = {name: tmp_path / f"victim-{name}" for name in ("log", "yaml", "tmp", "hard")}
    for victim in victims.values():
        victim.write_text("precious")
    (jobs / "grad_ascent.log").symlink_to(victims["log"])
    (jobs / "grad_ascent.yaml").symlink_to(victims["yaml"])
    (jobs / "grad_ascent.yaml.tmp").symlink_to(victims["tmp"])
    os.link(victims["hard"], jobs / "npo.log")
    cfg = build_config(TofuConfig, overrides=[f"out={out}", f"data={tmp_path / 'no-such-data'}"])
    status = run_jobs(cfg, ["grad_ascent", "npo"], jobs=2, say=lambda line: None, poll_seconds=0.2)
    assert set(status) == {"grad_ascent", "npo"}  # the jobs ran (and failed on the missing data)
    assert all(v.read_text() == "precious" for v in victims.values())  # no file outside --out written
    for name in ("grad_ascent.log", "grad_ascent.yaml", "npo.log"):
        assert not (jobs / name).is_symlink() and (jobs / name).stat().st_nlink == 1
    assert "no-such-data" in (jobs / "grad_ascent.log").read_text()  # the job's own log, written in --out


def test_a_jobs_folder_that_is_a_link_is_refused(tmp_path):
    from mmunlearn.errors import UnsafePathError
    from recipes.recipe_config import build_config
    from recipes.tofu.config import TofuConfig
    from recipes.tofu.parallel import JOBS_DIR, run_jobs

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / JOBS_DIR).symlink_to(tmp_path / "elsewhere")
    cfg = build_config(TofuConfig, overrides=[f"out={tmp_path / 'out'}"])
    with pytest.raises(UnsafePathError) as err:
        run_jobs(cfg, ["grad_ascent"], jobs=1, say=lambda line: None)
    user_error(err.value, str(tmp_path / "out" / JOBS_DIR), "symbolic link")
    assert listing(tmp_path / "elsewhere") == set()


# ------------------------------------------------------------------------ M6: report injection
HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "a | b",
    "line\nbreak",
    "&lt;b&gt;",
    "\x1b]0;owned\x07\x1b[31mred\x1b[0m",
    "# heading",
]


def test_record_cells_and_headers_are_escaped_for_the_page_and_the_terminal():
    from mmunlearn.report import make_record, render

    rows = [{"method": text, "value": 1.0} for text in HOSTILE]
    record = make_record(
        {"rows": rows},
        name="hostile",
        command="test",
        commit="x",
        columns=[["<b>method</b>", "method"], ["value | x", "value"]],
    )
    table = render(record).splitlines()
    assert len(table) == 2 + len(HOSTILE)  # one line per row: no line break survives
    for line in table:
        assert line.replace("\\|", "").count("|") == 3, line  # two cells per row: every | in a cell is escaped
    text = "\n".join(table)
    assert "<script" not in text and "<img" not in text and "<b>" not in text and "\x1b" not in text
    assert "&amp;lt;b&amp;gt;" in text and "&lt;script>" in text and "line<br>break" in text


@pytest.mark.parametrize("where", ["cell", "header"])
def test_a_results_marker_in_a_record_is_refused_and_the_page_stays_whole(tmp_path, where):
    from mmunlearn.report import make_record, update_pages, write_record

    results, page = tmp_path / "results", tmp_path / "page.md"
    results.mkdir()
    write_record(make_record({"rows": [{"m": "ok"}]}, name="r", command="c", commit="x"), results)
    page.write_text("# page\n\n<!-- results: r -->\n<!-- /results -->\n")
    update_pages([page], results)
    good = page.read_text()
    marker = "x <!-- /results --> y"
    source = {"rows": [{"m": marker if where == "cell" else "ok"}]}
    columns = [[marker if where == "header" else "m", "m"]]
    with pytest.raises(ValueError, match="results marker") as err:
        make_record(source, name="r", command="c", commit="x", columns=columns)
    user_error(err.value, "column")
    (results / "r.json").write_text(json.dumps({"name": "r", "columns": columns, "rows": source["rows"]}))
    for _ in range(2):  # a record edited by hand: refused on every update, the page never grows
        with pytest.raises(ValueError, match="results marker"):
            update_pages([page], results)
        assert page.read_text() == good


def test_a_deeply_nested_results_file_is_one_error(tmp_path):
    from mmunlearn.report import load_source

    path = tmp_path / "run.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError) as err:
        load_source(path)
    user_error(err.value, str(path))


# ------------------------------------------------------------------------ M5: T3 head sizes
@pytest.mark.parametrize(
    "head",
    [
        {"hidden": 32, "vocab": 512, "rank": 100_000},
        {"hidden": 32, "vocab": 10**9, "rank": 4},
        {"hidden": 32, "vocab": 512, "rank": -1},
        {"hidden": 32, "vocab": 512, "rank": 4.5},
        [32, 512, 4],
    ],
)
def test_tilt_config_sizes_are_checked_against_the_head_file_before_allocating(tmp_path, head):
    from mmunlearn.tilt.head import TiltHead
    from mmunlearn.tilt.model import CONFIG_NAME, TiltedCausalLM
    from tests.tiny import tiny_causal_lm

    base = tiny_causal_lm(layers=1)
    folder = TiltedCausalLM(base, TiltHead(32, 512, 4), temperature=1.0).save(tmp_path / "tilt")
    assert TiltedCausalLM.load(folder, base=base).head.config["rank"] == 4  # the control
    config = folder / CONFIG_NAME
    config.write_text(json.dumps({**json.loads(config.read_text()), "head": head}))
    before = digest_tree(folder)
    with pytest.raises(ValueError) as err:
        TiltedCausalLM.load(folder, base=base)
    user_error(err.value, str(config))
    assert digest_tree(folder) == before and listing(tmp_path) == {"tilt"}
