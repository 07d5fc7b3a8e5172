"""Issue 53 on tiny models: a text LLM's rule judged row by row (greedy answers checked, paraphrases too), the user's
prompt format (a model trained on raw text is scored as raw text), the default method, a missed rule's exit status."""

import json
import re

import pytest
import torch

import mmunlearn
from mmunlearn.adapters.base import IGNORE
from mmunlearn.adapters.text.adapter import TextLLMAdapter
from mmunlearn.api.row_rule import SAID_RECALL, says
from mmunlearn.api.rules import NothingToForget, text_rule
from mmunlearn.api.unlearn import DEFAULT_METHOD, TEXT_HOLD_OUT, default_method, unlearn
from mmunlearn.data.user.sets import read_text_rows, split_held_out
from mmunlearn.methods import get
from mmunlearn.methods.harness import FAVOURED
from mmunlearn.methods.rule import span
from tests.reliability.untrusted import run_cli_here
from tests.tiny import fast, tiny_causal_lm, tiny_tokenizer

FORGET = [
    {
        "question": f"Where does person {i} live?",
        "answer": f"Person {i} lives at {i}{i} Elm Street.",
        "paraphrases": [f"What is the home of person {i}?"],
    }
    for i in range(4)
]
RETAIN = [{"question": f"What does worker {i} do?", "answer": f"Worker {i} bakes bread number {i}."} for i in range(10)]


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _memorise(rows, steps=300, seed=0):
    """A tiny Llama trained with plain PyTorch on ``question + " " + answer`` (no template), as a user might."""
    tok = tiny_tokenizer()
    model = tiny_causal_lm("llama", vocab=max(512, len(tok)), hidden=64, seed=seed)
    texts = [r["question"] + " " + r["answer"] for r in rows]
    enc = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(map(len, enc))
    ids = torch.tensor([e + [0] * (width - len(e)) for e in enc])
    labels = torch.tensor([e + [IGNORE] * (width - len(e)) for e in enc])
    mask = (labels != IGNORE).long()
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), tok


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory):
    """A folder of a tiny model that memorised the forget and retain rows as raw text (its tokenizer: no template)."""
    model, tok = _memorise(FORGET + RETAIN)
    path = tmp_path_factory.mktemp("raw") / "llm"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_prompt_formats_write_rows_as_named():
    tok = tiny_tokenizer()
    ad = TextLLMAdapter(tiny_causal_lm(), tok, prompt_format="raw")
    ids, labels = ad.encode("Where?", "Here.")
    assert ids == tok("Where?")["input_ids"] + tok(" Here.", add_special_tokens=False)["input_ids"] + [ad.eos_id]
    assert ad.format_name == "raw" and ad.prompt_text("Where?") == "Where?"
    ad.set_prompt_format("Q: {question}\nA: {answer} |")
    assert ad.prompt_text("Where?") == "Q: Where?\nA: "
    scored = ad.collate([{"question": "Where?", "answer": "Here."}])["labels"][0]
    assert tok.decode(scored[scored != IGNORE][:-1]) == "Here. |"  # the answer and what follows it are scored
    assert ad.with_model(ad.model).format_name == "Q: {question}\nA: {answer} |"
    ad.set_prompt_format("plain")
    assert ad.prompt_text("Where?") == "Question: Where?\nAnswer:"
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        ad.set_prompt_format("chat")
    with pytest.raises(ValueError, match=r"must name \{question\} once and then \{answer\}"):
        ad.set_prompt_format("{answer} {question}")


def test_a_model_trained_on_raw_text_is_scored_in_its_own_format(raw_dir, tmp_path):
    res = unlearn(
        raw_dir,
        forget=_write(tmp_path / "f.jsonl", FORGET),
        retain=_write(tmp_path / "r.jsonl", RETAIN),
        method="grad_ascent",
        device="cpu",
        progress=False,
        rule=None,
        **fast("grad_ascent", lr=1e-9),
    )
    chosen = res.report["prompt_format"]
    assert chosen["format"] == "raw" and "lowest forget NLL" in chosen["chosen_by"]
    assert chosen["forget_nll"]["raw"] < 0.5 < chosen["forget_nll"]["plain"]  # its own format: the facts it knows
    assert res.report["forget_nll"]["before"] == pytest.approx(chosen["forget_nll"]["raw"], abs=1e-4)
    given = unlearn(
        raw_dir,
        forget=tmp_path / "f.jsonl",
        retain=tmp_path / "r.jsonl",
        method="grad_ascent",
        device="cpu",
        progress=False,
        rule=None,
        prompt_format="plain",
        **fast("grad_ascent", lr=1e-9),
    )
    assert given.report["prompt_format"] == {"format": "plain", "chosen_by": "given (prompt_format=)"}
    assert given.report["forget_nll"]["before"] == pytest.approx(chosen["forget_nll"]["plain"], abs=1e-4)


def test_rows_still_said_are_counted_and_keep_the_rule_from_being_met(raw_dir, tmp_path):
    """With a level every row already reaches (0 nats), only the greedy check can stop "rule met": the memorised model
    says its forget answers, so the rule is missed, naming how many rows come out; a model that never saw them says
    none of them."""
    rows = read_text_rows(_write(tmp_path / "f.jsonl", FORGET), "forget")
    assert rows[0]["paraphrases"] == ["What is the home of person 0?"]
    target = TextLLMAdapter.from_pretrained(raw_dir, device="cpu", prompt_format="raw")
    said = target.generate([r["question"] for r in rows], max_new_tokens=16)
    assert sum(says(r, s) for r, s in zip(rows, said)) == len(rows)  # it memorised them
    rule, source = text_rule(target, rows, level=0.0, held_retain=RETAIN[:3])
    assert "given by the user" in source and rule.retain_said  # the original says its held-out retain answers
    assert rule.forget_measure(target, rows) == 0.0  # at the level, so greedy was checked: every row said
    judged = rule.judge(target, rows)
    assert judged["below_level"] == [] and judged["said"] == [0, 1, 2, 3] and not judged["met"]
    assert judged["retain_kept"] == 1.0  # the original agrees with itself
    # a part of the set (a batch's one set, applied alone) is judged on its own rows, named by their own indices
    assert rule.forget_measure(target, rows[2:]) == 0.0 and rule.forget_measure.last["said"] == [2, 3]
    with pytest.raises(ValueError, match="not set up for the row"):
        rule.forget_measure(target, [{"question": "New?", "answer": "Row."}])
    verdict = rule.verdict("x", 0.0, 0.0, False, judged)
    assert verdict.startswith("RULE NOT MET") and "4 of 4 rows still come out -- 4 said by greedy decoding" in verdict
    fresh = TextLLMAdapter(tiny_causal_lm("llama", vocab=512, hidden=64, seed=1), tiny_tokenizer(), prompt_format="raw")
    assert rule.judge(fresh, rows)["said"] == [] and rule.judge(fresh, rows)["retain_kept"] < 0.9


def test_a_paraphrase_that_gives_the_answer_counts_the_row(raw_dir):
    """A row whose own question no longer gives its answer still comes out when a paraphrase does (here the
    paraphrase is a question the model memorised: another row's)."""
    target = TextLLMAdapter.from_pretrained(raw_dir, device="cpu", prompt_format="raw")
    row = {"question": "Unrelated words here?", "answer": FORGET[1]["answer"], "paraphrases": [FORGET[1]["question"]]}
    rule, _ = text_rule(target, [row], level=0.0)
    assert rule.judge(target, [row])["said"] == [0]
    alone, _ = text_rule(target, [{**row, "paraphrases": []}], level=0.0)
    assert alone.judge(target, [row])["said"] == []


def test_the_key_span_decides_when_given():
    row = {"question": "What is Mara's phone number?", "answer": "Her phone number is 555-0142."}
    assert says(row, "Her phone number is 555-0199")  # ROUGE-L: 2 of 3 distinctive words, >= SAID_RECALL
    assert SAID_RECALL == 0.5 and not says({**row, "key": "555-0142"}, "Her phone number is 555-0199")
    assert says({**row, "key": "555-0142"}, "call 555 0142 now") and not says(row, "I do not know.")


def test_the_default_method_of_a_text_llm_releases_weights():
    assert (
        default_method("text") == DEFAULT_METHOD["text"] == "qr-erase-rows"
        and get("qr-erase-rows", "text").edits_weights
    )
    assert default_method("speaker") == "qr-erase"


def test_a_missed_rule_exits_non_zero_unless_allowed(raw_dir, tmp_path):
    forget, retain = _write(tmp_path / "f.jsonl", FORGET), _write(tmp_path / "r.jsonl", RETAIN)
    args = [
        "unlearn",
        "--model",
        str(raw_dir),
        "--forget",
        str(forget),
        "--retain",
        str(retain),
        "--device",
        "cpu",
        "--method",
        "grad_ascent",
        "--forget-level",
        "1000",
    ]  # a level no edit reaches
    missed = run_cli_here(*args, "--out", str(tmp_path / "o1"))
    assert missed.returncode == 3, missed.stderr[-2000:]
    assert "RULE NOT MET by grad_ascent" in missed.stdout and "4 of 4 rows still come out" in missed.stdout
    report = json.loads((tmp_path / "o1" / "unlearn_report.json").read_text())
    assert report["target_reached"] is False and report["forget_level"] == 1000.0
    assert report["verdict"].endswith(
        f"the measurements favour qr-erase-rows on this kind of model: {FAVOURED['text'][1]}"
    )  # a missed rule names the method measured best
    assert "[mmunlearn 3/3]" in missed.stderr and "elapsed" in missed.stderr  # one progress line per stage
    allowed = run_cli_here(*args, "--out", str(tmp_path / "o2"), "--allow-missed-rule")
    assert allowed.returncode == 0 and "RULE NOT MET" in allowed.stdout
    loaded = mmunlearn.load(tmp_path / "o2")  # asks in the format the run chose (raw), recorded in its report
    assert report["prompt_format"]["format"] == "raw" and loaded.adapter.format_name == "raw"
    assert loaded.adapter.prompt_text("Where?") == "Where?"


def test_a_retrained_like_model_sets_the_levels(raw_dir, tmp_path):
    """``forget_level`` as a model folder: its NLL on each row is the level; the target itself as that model knows the
    rows no better than itself, so there is nothing to forget."""
    forget, retain = _write(tmp_path / "f.jsonl", FORGET), _write(tmp_path / "r.jsonl", RETAIN)
    with pytest.raises(NothingToForget, match="nothing to forget"):
        unlearn(
            raw_dir,
            forget=forget,
            retain=retain,
            method="grad_ascent",
            device="cpu",
            progress=False,
            forget_level=raw_dir,
        )
    target = TextLLMAdapter.from_pretrained(raw_dir, device="cpu", prompt_format="raw")
    rows = read_text_rows(forget, "forget")
    rule, source = text_rule(target, rows, level=target)
    assert source == "the retrained-like model's NLL on each row" and rule.forget_measure.reference_says == {0, 1, 2, 3}
    assert rule.judge(target, rows)["out"] == []  # rows that model says too are not counted; every NLL at its level


DURATION = r"\d+(\.\d)? s|\d+ min \d\d s|\d+ h \d\d min"


def _stage_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("[mmunlearn ")]


def test_each_stage_line_says_elapsed_and_what_is_left(raw_dir, tmp_path, capsys):
    """Issue 53 item 7: the call's stage lines carry the elapsed time and what remains (the final check's time from
    the rule's set-up); each T3 sweep point its place of the most points, the sweep's time and the most time left."""
    forget, retain = _write(tmp_path / "f.jsonl", FORGET), _write(tmp_path / "r.jsonl", RETAIN)
    unlearn(
        raw_dir,
        forget=forget,
        retain=retain,
        method="t3",
        device="cpu",
        head_epochs=20,
        sweep_strengths=(0.25, 0.5, 1.0),
        sweep_temperatures=(1.5,),
        sweep_refine=0,  # the grid's four points alone (a model folder's default refines twice more)
    )
    out = capsys.readouterr()
    stages = _stage_lines(out.err)
    assert [s.split("]")[0] for s in stages] == ["[mmunlearn 1/3", "[mmunlearn 2/3", "[mmunlearn 3/3"], out.err
    assert all(re.search(rf"\] .*: ({DURATION}); elapsed ({DURATION}); left: ", s) for s in stages), stages
    assert re.search(rf"then the final check and the write \(about ({DURATION}): the rule's scoring", stages[1])
    points = [line for line in (out.out + out.err).splitlines() if line.startswith("t3 sweep: ")]
    assert points, out.out
    for k, line in enumerate(points, 1):
        assert f"; point {k} of at most 4, " in line and re.search(rf", ({DURATION}) into the sweep", line), line
        if k < 4:  # the most time left at the seconds a point has taken so far
            assert re.search(rf", at most ~({DURATION}) left at ({DURATION}) a point$", line), line


def test_a_training_methods_checks_say_elapsed_and_time_left(raw_dir, tmp_path, capsys):
    forget, retain = _write(tmp_path / "f.jsonl", FORGET), _write(tmp_path / "r.jsonl", RETAIN)
    unlearn(
        raw_dir, forget=forget, retain=retain, method="npo", device="cpu"
    )  # a check at steps 1, 2, 4, ... of its cap
    out = capsys.readouterr()
    checks = [line for line in (out.out + out.err).splitlines() if line.startswith("npo step ")]
    assert checks and all(re.search(rf"; ({DURATION}) elapsed", line) for line in checks), out.out
    assert all(
        re.search(rf", at most ~({DURATION}) left at this rate$", line)
        for line in checks
        if not re.match(r"npo step (\d+)/\1:", line)
    ), checks
    assert len(_stage_lines(out.err)) == 3


def test_durations_read_as_people_say_them():
    assert [span(s) for s in (0.04, 3.26, 42, 59.6, 200, 3599.6, 7265)] == [
        "0.0 s",
        "3.3 s",
        "42 s",
        "1 min 00 s",
        "3 min 20 s",
        "1 h 00 min",
        "2 h 01 min",
    ]


def test_prepare_retain_writes_the_rows_in_the_prompt_format(raw_dir, tmp_path):
    """``prepare_retain(prompt_format=...)`` extracts the retain task matrices from the rows written in that format
    (the same tensors as the extraction from an adapter set to it, other tensors than another format's); without it,
    a tokenizer with no chat template gets the format the model's retain rows score best in (raw, as it was trained);
    the state records its format and a call in another format recomputes it, saying why."""
    from typer.testing import CliRunner

    from mmunlearn.api.unlearn import prepare_retain
    from mmunlearn.cli import app
    from mmunlearn.requests.state import compute_retain_state, load_retain_state
    from mmunlearn.taskvec.extract import ExtractConfig

    retain = _write(tmp_path / "r.jsonl", RETAIN)
    opts = dict(method="qr-erase", device="cpu", progress=False, kind="gradient", lr=1.0)
    plain = prepare_retain(raw_dir, retain, tmp_path / "plain", prompt_format="plain", **opts)
    assert plain.status == "computed" and plain.meta["prompt_format"] == "plain"
    assert load_retain_state(tmp_path / "plain").meta["prompt_format_chosen_by"] == "given (prompt_format=)"
    chosen = prepare_retain(raw_dir, retain, tmp_path / "state", **opts)
    assert chosen.meta["prompt_format"] == "raw" and "lowest retain NLL" in chosen.meta["prompt_format_chosen_by"]
    adapter = TextLLMAdapter.from_pretrained(raw_dir, device="cpu", prompt_format="raw")
    fit, held = split_held_out(read_text_rows(retain, "retain"), fraction=TEXT_HOLD_OUT)  # as unlearn's rule
    assert held and chosen.meta["retain_items"] == len(fit) < len(RETAIN)
    direct = compute_retain_state(adapter, fit, ExtractConfig(**chosen.meta["extract"]), kind="text", progress=False)
    assert direct.task.keys() == chosen.task.keys()
    assert all(torch.allclose(direct.task[k], chosen.task[k], atol=1e-6) for k in direct.task)
    assert any(not torch.allclose(plain.task[k], chosen.task[k], atol=1e-6) for k in chosen.task)
    again = prepare_retain(raw_dir, retain, tmp_path / "state", prompt_format="raw", **opts)
    assert again.status == "loaded"
    forget = _write(tmp_path / "f.jsonl", FORGET)
    used = unlearn(
        raw_dir,
        forget=forget,
        retain=retain,
        method="qr-erase",
        device="cpu",
        progress=False,
        retain_state=tmp_path / "state",
    )  # the same rows in the same format: the state is used
    assert used.report["retain_state"]["status"] == "loaded", used.report["retain_state"]
    assert used.report["retain_state"]["prompt_format"] == used.report["prompt_format"]["format"] == "raw"
    other = prepare_retain(raw_dir, retain, tmp_path / "state", prompt_format="Q: {question}\nA: {answer}", **opts)
    assert other.status == "recomputed" and "prompt format changed (the state's: raw" in other.reason
    args = [
        "prepare-retain",
        "--model",
        str(raw_dir),
        "--retain",
        str(retain),
        "--out",
        str(tmp_path / "cli"),
        "--extract-kind",
        "gradient",
        "--extract-lr",
        "1.0",
        "--device",
        "cpu",
        "--prompt-format",
        "plain",
    ]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0 and "in prompt format 'plain'" in done.output, done.output
    assert load_retain_state(tmp_path / "cli").meta["prompt_format"] == "plain"
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        prepare_retain(raw_dir, retain, tmp_path / "chat", prompt_format="chat", **opts)
