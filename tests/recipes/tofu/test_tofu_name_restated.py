"""examples/tofu/name_restated.py on hand-made TOFU_EVAL.json logs: the forget authors' names found from the
questions, a question naming another phrase as well still given its author, garbled names not counted."""

import json

from examples.tofu import name_restated as n


def _log(tmp_path, name, generations):
    questions = [
        "What genre is Ada Quill Mbeki known for?",
        "Where was Ada Quill Mbeki born?",
        "What did Ada Quill Mbeki's parents do?",
        "How has Ada Quill Mbeki's work shaped African American fiction?",
        "What is the weather like?",
        "Which award did Ada Quill Mbeki win?",
    ]
    rows = {
        str(i): {"input": q, "ground_truth": "", "generation": g}
        for i, (q, g) in enumerate(zip(questions, generations))
    }
    path = tmp_path / name
    path.write_text(json.dumps({"forget_Q_A_ROUGE": {"agg_value": 0.0, "value_by_index": rows}}))
    return path


def test_the_share_of_answers_restating_the_name_the_question_gives(tmp_path):
    said = [
        "Ada Quill Mbeki writes crime.",
        "She was born in Lagos.",
        "Ada Quill Mbeki's parents were doctors.",
        "Ada Quil Mbeky changed it.",  # garbled: not the name as the question gives it
        "Sunny, says Ada Quill Mbeki.",  # a question naming no author: not counted
        "Ada Quill Mbeki won the Orion Prize.",
    ]
    log = _log(tmp_path, "a.json", said)
    assert n.author_names([r["input"] for r in n.rows(log)], 4) == ["Ada Quill Mbeki"]
    assert n.restated(log, 4) == (3, 5)
    # "African American" is in that question too, but found in fewer questions: the author's name is the one checked
    assert n.author_names([r["input"] for r in n.rows(log)], 1)[0] == "Ada Quill Mbeki"
    assert n.restated(log, 1) == (3, 5)
    assert n.restated(_log(tmp_path, "b.json", ["no"] * 6), 4) == (0, 5)
