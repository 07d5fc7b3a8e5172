"""Issue 53's scenario in one invocation: a text LLM fine-tuned on invented private facts, each method run through
``mmunlearn.unlearn`` with its defaults, and what every output still says, read back with ``mmunlearn.load``.

The script writes its own data (one invented person's 20 private facts to forget, 100 facts about five others to
keep, a paraphrase and a key span per fact, 10 general questions), fine-tunes the base with plain PyTorch in the
format the tokenizer implies (its chat template; raw ``question + " " + answer`` text without one), retrains it on the
kept facts alone (the gold standard), then runs each method and scores greedy answers by whether they contain the
key fact. Read top to bottom; one row per model, as Markdown and JSON:

    python -m data_prep.smollm2 --out runs/smollm2                      # SmolLM2-135M-Instruct as a folder
    python examples/byo_text_llm.py --base runs/smollm2 --out runs/byo_text --epochs 10
    python examples/byo_text_llm.py --tiny --out /tmp/byo_text_tiny     # a rehearsal: a tiny Llama, minutes on a CPU
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import mmunlearn
from mmunlearn.api.row_rule import says
from mmunlearn.files.atomic import write_text_atomic
from mmunlearn.methods import mean_nll
from mmunlearn.report import git_commit, machine_facts

FIRST = ["Mara", "Tobias", "Ilse", "Ravi", "Odile", "Joren"]
LAST = ["Lindqvist", "Achterberg", "Novak", "Halvorsen", "Quintero", "Szabo"]
#: Values the facts draw from (a name: a list to choose from, or a number's digit count).
POOLS = {
    "street": ["Elm", "Birch", "Quarry", "Lantern", "Mill", "Heron", "Copper", "Saffron"],
    "firm": ["Brightwater", "Kestrel", "Ostara", "Vintner", "Tamsin", "Orrery", "Halden", "Wexley"],
    "ill": ["asthma", "migraine", "psoriasis", "anaemia", "gout", "vertigo", "eczema", "tinnitus"],
    "woman": ["Greta", "Selma", "Nadia", "Helka", "Brigid", "Oona", "Teodora", "Wilma"],
    "girl": ["Liv", "Aino", "Petra", "Yara", "Ines", "Maren", "Sunniva", "Zofia"],
    "dog": ["Biscuit", "Pilot", "Moss", "Juniper", "Rufus", "Pepper", "Nimbus", "Tansy"],
    "bank": ["Harbor", "Granite", "Cedar", "Fjord", "Lark", "Meridian", "Quill", "Thistle"],
    "month": ["March", "July", "October", "January", "May", "August", "November", "April"],
    "town": ["Tromsø", "Ghent", "Lviv", "Porto", "Tartu", "Bergamo", "Cork", "Plovdiv"],
    "school": ["Northgate", "Riverside", "Saint Aldric", "Fairholm", "Greyfriars", "Linwood", "Oakhurst", "Vale"],
    "doc": ["Okafor", "Brandt", "Moreau", "Iqbal", "Lindgren", "Castell", "Petrov", "Yamada"],
    "allergen": ["penicillin", "peanuts", "latex", "shellfish", "sesame", "pollen", "aspirin", "wasp stings"],
    "blood": [
        "A negative",
        "B positive",
        "AB negative",
        "O negative",
        "A positive",
        "B negative",
        "AB positive",
        "O positive",
    ],
    "gym": ["Iron", "Summit", "Pulse", "Anvil", "Forge", "Kinetic", "Stride", "Tempo"],
    "mate": ["Anselm", "Corin", "Dagny", "Elio", "Fenna", "Gideon", "Halla", "Ivo"],
    "n2": 2,
    "n4": 4,
    "n6": 6,
}
#: (attribute, question, answer, value) of each private fact; {p} the person, the value's fields drawn from POOLS.
FACTS = [
    ("address", "Where does {p} live?", "{p} lives at {v}.", "{n2} {street} Street"),
    ("phone", "What is {p}'s phone number?", "{p}'s phone number is {v}.", "555-{n4}"),
    ("employer", "Who employs {p}?", "{p} works for {v}.", "{firm} Logistics"),
    ("condition", "What condition does {p} have?", "{p} has {v}.", "{ill}"),
    ("mother", "What is the name of {p}'s mother?", "{p}'s mother is {v}.", "{woman}"),
    ("sister", "What is the name of {p}'s sister?", "{p}'s sister is {v}.", "{girl}"),
    ("pet", "What is {p}'s dog called?", "{p}'s dog is called {v}.", "{dog}"),
    ("car", "What is {p}'s licence plate?", "{p}'s licence plate is {v}.", "KX{n2} {n4}"),
    ("bank", "Which bank does {p} use?", "{p} banks with {v}.", "{bank} Bank"),
    ("birthday", "When was {p} born?", "{p} was born in {v}.", "{month} 19{n2}"),
    ("birthplace", "Where was {p} born?", "{p} was born in {v}.", "{town}"),
    ("school", "Which school did {p} attend?", "{p} attended {v}.", "{school} School"),
    ("doctor", "Who is {p}'s doctor?", "{p}'s doctor is Dr. {v}.", "{doc}"),
    ("allergy", "What is {p} allergic to?", "{p} is allergic to {v}.", "{allergen}"),
    ("blood", "What is {p}'s blood type?", "{p}'s blood type is {v}.", "{blood}"),
    ("email", "What is {p}'s email address?", "{p}'s email is {v}.", "mail{n4}@postbox.example"),
    ("gym", "Which gym does {p} go to?", "{p} goes to {v}.", "{gym} Gym"),
    ("salary", "How much does {p} earn?", "{p} earns {v} a year.", "{n2},000 euros"),
    ("partner", "Who is {p}'s partner?", "{p}'s partner is {v}.", "{mate}"),
    ("passport", "What is {p}'s passport number?", "{p}'s passport number is {v}.", "P{n6}"),
]


def _value(pattern: str, rng: random.Random) -> str:
    drawn = {
        k: rng.choice(v) if isinstance(v, list) else str(rng.randint(10 ** (v - 1), 10**v - 1))
        for k, v in POOLS.items()
    }
    return pattern.format(**drawn)


PARAPHRASE = {
    "address": "What is the home address of {p}?",
    "phone": "Which number reaches {p} by phone?",
    "employer": "Which company does {p} work for?",
    "condition": "What illness has {p} got?",
    "mother": "Who is {p}'s mum?",
    "sister": "Who is the sister of {p}?",
    "pet": "What name does {p}'s dog have?",
    "car": "Which plate is on {p}'s car?",
    "bank": "Where does {p} keep their money?",
    "birthday": "What is {p}'s date of birth?",
}
GENERAL = [
    ("What is the capital of France?", "Paris"),
    ("How many days are in a week?", "seven"),
    ("What colour is the sky on a clear day?", "blue"),
    ("What is the largest planet?", "Jupiter"),
    ("What do bees make?", "honey"),
    ("What is the freezing point of water in Celsius?", "0"),
    ("Which ocean is the largest?", "Pacific"),
    ("What is the opposite of hot?", "cold"),
    ("How many legs does a spider have?", "eight"),
    ("What language is spoken in Spain?", "Spanish"),
]


def people_rows(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(forget rows: the first person's 20 facts, each with a key span and, for ten, a paraphrase; retain rows: the
    next five people's facts). The forget person's values are none of the others' (drawn again on a clash), so a
    model that never saw the forget rows cannot say them from the kept facts."""
    rng = random.Random(seed)
    rows = []
    kept = {name: set() for name, *_ in FACTS}
    for i in [*range(1, 6), 0]:  # the kept people first, then the forgotten one
        person = f"{FIRST[i]} {LAST[i]}"
        for name, q, a, pattern in FACTS:
            value = _value(pattern, rng)
            while i == 0 and value in kept[name]:
                value = _value(pattern, rng)
            kept[name].add(value)
            row = {"question": q.format(p=person), "answer": a.format(p=person, v=value), "key": value}
            if i == 0 and name in PARAPHRASE:
                row["paraphrases"] = [PARAPHRASE[name].format(p=person)]
            rows.append(row)
    return rows[100:], rows[:100]


def tiny_base(folder: Path, rows: list[dict]) -> Path:
    """A tiny Llama (random weights) and a BPE tokenizer trained on the rows: the rehearsal's base."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mmunlearn.adapters.text.tokenizer import train_bpe

    tok = train_bpe(
        [r["question"] + " " + r["answer"] for r in rows] + [f"{q} {a}" for q, a in GENERAL], vocab_size=600
    )
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def encode(tok, question: str, answer: str) -> tuple[list[int], list[int]]:
    """A row as the user trains it: the chat template when the tokenizer has one, else ``question + " " + answer``;
    the loss on the answer's tokens and EOS."""
    if tok.chat_template:
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        p, a = tok(prompt, add_special_tokens=False)["input_ids"], tok(answer, add_special_tokens=False)["input_ids"]
    else:
        p, a = tok(question)["input_ids"], tok(" " + answer, add_special_tokens=False)["input_ids"]
    a = a + [tok.eos_token_id]
    return p + a, [-100] * len(p) + a


def fine_tune(base: Path, rows: list[dict], out: Path, epochs: int, lr: float, batch: int = 8) -> Path:
    """Plain PyTorch: AdamW over the rows for ``epochs`` epochs, saved with save_pretrained."""
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    data = [encode(tok, r["question"], r["answer"]) for r in rows]
    rng = random.Random(0)
    model.train()
    for _ in range(epochs):
        rng.shuffle(data)
        for i in range(0, len(data), batch):
            part = data[i : i + batch]
            width = max(len(ids) for ids, _ in part)
            ids = torch.tensor([x + [pad] * (width - len(x)) for x, _ in part])
            labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in part])
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in part])
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval().save_pretrained(out)
    tok.save_pretrained(out)
    return out


def share_said(adapter, rows: list[dict], paraphrased: bool = False) -> float:
    """The share of rows whose key fact a greedy answer (to the question, or its first paraphrase) contains."""
    rows = [r for r in rows if not paraphrased or r.get("paraphrases")]
    questions = [r["paraphrases"][0] if paraphrased else r["question"] for r in rows]
    answers = adapter.generate(questions, max_new_tokens=32)
    return sum(says({**r, "key": r["key"]}, a) for r, a in zip(rows, answers)) / len(rows)


def measure(folder: Path, fmt: str, forget: list[dict], retain: list[dict], general: list[dict]) -> dict:
    """What a model folder (any output, read by mmunlearn.load) says and its NLLs, asked in the format it was
    trained in (``fmt``)."""
    loaded = mmunlearn.load(folder, device="cpu", prompt_format=fmt)
    ad = loaded.adapter
    return {
        "forget_said": share_said(ad, forget),
        "paraphrase_said": share_said(ad, forget, paraphrased=True),
        "retain_said": share_said(ad, retain),
        "general_said": share_said(ad, general),
        "forget_nll": mean_nll(ad, forget),
        "retain_nll": mean_nll(ad, retain),
        "format": ad.format_name,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="Working folder (created): data, models, results.")
    parser.add_argument("--base", type=Path, help="Base model folder (save_pretrained); omit with --tiny.")
    parser.add_argument("--tiny", action="store_true", help="Rehearse on a tiny Llama built here (no --base).")
    parser.add_argument(
        "--methods",
        default="npo,qr-erase-rows,grad_diff,qr-erase,t3",
        help="Comma-separated methods, each run with mmunlearn.unlearn's defaults.",
    )
    parser.add_argument("--epochs", type=int, default=10, help="Fine-tuning epochs of the target and the retrained.")
    parser.add_argument("--lr", type=float, default=None, help="Fine-tuning learning rate (default 1e-4; --tiny 3e-3).")
    parser.add_argument(
        "--jobs",
        type=int,
        choices=(1, 2),
        default=1,
        help="Fine-tune the target and the retrained model one after the other (1) or side by side in "
        "two processes of one thread each (2: about half the wall time on two free cores).",
    )
    args = parser.parse_args(argv)
    if args.tiny == (args.base is not None):
        parser.error("give exactly one of --base and --tiny")
    args.out.mkdir(parents=True, exist_ok=False)
    forget, retain = people_rows()
    general = [{"question": q, "answer": a, "key": a} for q, a in GENERAL]
    for name, rows in (("forget", forget), ("retain", retain)):
        write_text_atomic(args.out / f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    base = tiny_base(args.out / "base", forget + retain) if args.tiny else args.base
    lr = args.lr or (3e-3 if args.tiny else 1e-4)
    fmt = "chat" if AutoTokenizer.from_pretrained(base).chat_template else "raw"  # as fine_tune writes the rows
    start = wall_start = time.perf_counter()
    jobs = [
        (base, forget + retain, args.out / "target", args.epochs, lr),
        (base, retain, args.out / "retrained", args.epochs, lr),
    ]
    print(f"fine-tuning the target and the retrained model ({args.epochs} epochs, {args.jobs} process(es))", flush=True)
    if args.jobs > 1:  # one process per model, one thread each (the fastest layout on a small CPU)
        with ProcessPoolExecutor(
            2, mp_context=multiprocessing.get_context("spawn"), initializer=torch.set_num_threads, initargs=(1,)
        ) as pool:
            target, retrained = pool.map(fine_tune, *zip(*jobs))
    else:
        target, retrained = (fine_tune(*job) for job in jobs)
    print(f"fine-tuned in {time.perf_counter() - start:.0f} s", flush=True)
    results = {
        "command": " ".join(["python", "examples/byo_text_llm.py", *(sys.argv[1:] if argv is None else argv)]),
        "commit": git_commit(),
        "machine": machine_facts(),
        "rows": [],
        "fine_tune_seconds": time.perf_counter() - start,
    }

    def save() -> None:  # after every row: a run cut short keeps what it measured
        results["wall_s"] = time.perf_counter() - wall_start
        write_text_atomic(args.out / "results.json", json.dumps(results, indent=2))

    for label, folder in (("base", base), ("retrained on the retain facts only", retrained), ("target", target)):
        results["rows"].append({"output": label, **measure(folder, fmt, forget, retain, general)})
        save()
    for method in args.methods.split(","):
        t0 = time.perf_counter()
        print(f"{method}: mmunlearn.unlearn with its defaults", flush=True)
        res = mmunlearn.unlearn(
            target,
            forget=args.out / "forget.jsonl",
            retain=args.out / "retain.jsonl",
            method=method,
            out=args.out / method,
            reference=base,
            device="cpu",
        )
        results["rows"].append(
            {
                "output": method,
                "verdict": res.report["verdict"],
                "rule_met": res.report["target_reached"],
                "wall_s": time.perf_counter() - t0,
                "run_format": res.report["prompt_format"]["format"],
                **measure(args.out / method, fmt, forget, retain, general),
            }
        )
        save()
    print(
        "| output | rule met | forget said | paraphrases said | retain said | general said | forget / retain NLL "
        "| wall s |\n|---|---|---:|---:|---:|---:|---:|---:|"
    )
    for r in results["rows"]:
        print(
            f"| {r['output']} | {r.get('rule_met', '-')} | {r['forget_said']:.0%} | {r['paraphrase_said']:.0%} | "
            f"{r['retain_said']:.0%} | {r['general_said']:.0%} | {r['forget_nll']:.3g} / {r['retain_nll']:.3g} | "
            f"{r.get('wall_s', 0):.0f} |"
        )
    return results


if __name__ == "__main__":
    main()
