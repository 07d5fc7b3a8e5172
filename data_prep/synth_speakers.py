"""Built-in speech corpus: espeak-ng speakers (espeakng-loader, ctypes) in the VoxCeleb2 layout.

Each speaker is an espeak-ng voice+variant (``en-us+f3``, ``en-gb-scotland+m2``, ...) with its own
pitch, pitch range and rate; each of its "videos" (sessions) nudges those settings and has its
own gain and noise floor. Sentences come from a seeded template grammar. Output::

    <out>/dev/aac/idNNNNN/<video>/NNNNN.wav   16 kHz mono 16-bit PCM
    <out>/vox2_meta.csv                       like the real file, stray spaces included
    <out>/transcripts.csv                     ID,spk_id,video,utterance,wav,text (wav: relative)
    <out>/speakers.csv                        the voice settings of each speaker
    <out>/synth_stamp.json                    the options; same options -> the run is skipped

Determinism: espeak-ng keeps state between utterances in one process (a pitch-flutter phase, a
noise generator), so the same text comes out differently the second time. Seeding its noise
(``espeak_ng_SetRandSeed``) before each utterance *and* synthesising each speaker in a fresh
process, in a fixed order, makes the output byte-identical for a given seed (tested).
"""

from __future__ import annotations

import csv
import ctypes
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from mmunlearn.progress import StageBar

ESPEAK_SR = 22050
OUT_SR = 16000
STAMP_NAME = "synth_stamp.json"
FORMAT_VERSION = 1
META_HEADER = ["VoxCeleb2 ID ", "VGGFace2 ID ", "Gender ", "Set "]

ACCENTS = ("en", "en-us", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc")
VARIANTS = {
    "m": ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "klatt2", "klatt3", "Andy", "travis", "Denis"),
    "f": ("f1", "f2", "f3", "f4", "f5", "anika", "linda", "steph", "Annie", "Alicia", "belinda"),
}

_ADJ = (
    "quiet",
    "bright",
    "old",
    "heavy",
    "small",
    "golden",
    "rapid",
    "gentle",
    "narrow",
    "frozen",
    "purple",
    "famous",
    "empty",
    "careful",
    "distant",
    "wooden",
)
_NOUN = (
    "teacher",
    "river",
    "window",
    "farmer",
    "garden",
    "engine",
    "letter",
    "doctor",
    "bridge",
    "camera",
    "island",
    "pilot",
    "kitchen",
    "market",
    "violin",
    "forest",
)
_VERB = (
    "painted",
    "followed",
    "opened",
    "carried",
    "visited",
    "repaired",
    "watched",
    "described",
    "found",
    "cleaned",
    "borrowed",
    "measured",
    "pushed",
    "noticed",
    "built",
    "sold",
)
_PLACE = (
    "near the station",
    "behind the library",
    "across the valley",
    "inside the museum",
    "under the old bridge",
    "beside the harbour",
    "at the top of the hill",
    "in the village",
)
_TIME = (
    "yesterday",
    "every morning",
    "last winter",
    "before dinner",
    "after the storm",
    "on sunday",
    "at midnight",
    "twice a week",
)


def make_sentence(rng: random.Random) -> str:
    """One English sentence from a small template grammar, driven only by ``rng``."""
    a, b = rng.sample(_NOUN, 2)
    kind = rng.randrange(3)
    if kind == 0:
        s = f"the {rng.choice(_ADJ)} {a} {rng.choice(_VERB)} the {b} {rng.choice(_PLACE)}"
    elif kind == 1:
        s = f"{rng.choice(_TIME)} a {rng.choice(_ADJ)} {a} {rng.choice(_VERB)} my {rng.choice(_ADJ)} {b}"
    else:
        s = f"nobody {rng.choice(_VERB)} the {a} {rng.choice(_PLACE)} {rng.choice(_TIME)}"
    return s[0].upper() + s[1:] + "."


@dataclass(frozen=True)
class Speaker:
    """Voice settings of one synthetic speaker (espeak parameters: pitch/range 0-99, rate wpm)."""

    spk_id: str
    gender: str
    voice: str
    pitch: int
    range: int
    rate: int


def make_speakers(n: int, seed: int) -> list[Speaker]:
    """``n`` speakers alternating m/f; distinct accent+variant pairs until the pool runs out."""
    rng = random.Random(f"speakers:{seed}")
    pools = {g: [f"{a}+{v}" for a in ACCENTS for v in VARIANTS[g]] for g in VARIANTS}
    for pool in pools.values():
        rng.shuffle(pool)
    out = []
    for i in range(n):
        g = "m" if i % 2 == 0 else "f"
        voice = pools[g][(i // 2) % len(pools[g])]
        out.append(Speaker(f"id{i + 1:05d}", g, voice, rng.randint(30, 70), rng.randint(30, 70), rng.randint(140, 190)))
    return out


def _video_id(rng: random.Random) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
    return "".join(rng.choice(alphabet) for _ in range(11))  # YouTube-style, like VoxCeleb2


class Espeak:
    """Minimal ctypes binding of libespeak-ng (from espeakng-loader) in synchronous mode."""

    _CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
    _RATE, _PITCH, _RANGE = 1, 3, 4  # espeak_PARAMETER
    _SYNCHRONOUS, _DONT_EXIT, _CHARS_UTF8, _POS_CHARACTER = 2, 0x8000, 1, 1

    def __init__(self) -> None:
        import espeakng_loader

        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        rate = lib.espeak_Initialize(self._SYNCHRONOUS, 0, espeakng_loader.get_data_path().encode(), self._DONT_EXIT)
        if rate != ESPEAK_SR:
            raise RuntimeError(f"espeak-ng initialisation failed or rate {rate} != {ESPEAK_SR}")
        self._lib, self._chunks = lib, []
        self._cb = self._CALLBACK(self._collect)  # keep a reference: C holds only the pointer
        lib.espeak_SetSynthCallback(self._cb)

    def _collect(self, wav, n, _events) -> int:
        if n > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0

    def synth(self, text: str, voice: str, pitch: int, range_: int, rate: int, rand_seed: int) -> np.ndarray:
        """Speak ``text``; int16 samples at 22.05 kHz."""
        lib, self._chunks = self._lib, []
        if lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {voice!r}")
        for param, value in ((self._RATE, rate), (self._PITCH, pitch), (self._RANGE, range_)):
            lib.espeak_SetParameter(param, int(value), 0)
        lib.espeak_ng_SetRandSeed(rand_seed)
        buf = text.encode() + b"\0"
        status = lib.espeak_Synth(buf, len(buf), 0, self._POS_CHARACTER, 0, self._CHARS_UTF8, None, None)
        if status != 0:
            raise RuntimeError(f"espeak_Synth failed with status {status} on {text!r}")
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)


def _worker_main() -> None:
    """Worker process entry: JSON task on stdin -> .npz of int16 utterances at ``task['out']``."""
    task = json.load(sys.stdin)
    engine = Espeak()
    waves = [engine.synth(text, task["voice"], *rest) for text, *rest in task["jobs"]]
    np.savez(task["out"], *waves)


def _synth_speaker(task: dict) -> list[np.ndarray]:
    """Synthesise one speaker's utterances in a fresh interpreter (see the module notes).

    A plain subprocess rather than multiprocessing: spawn/forkserver re-import the caller's main
    module (breaking unguarded scripts and notebooks) and fork is unsafe once torch's threads run.
    """
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[1])  # importable even from a plain checkout
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    code = "from data_prep.synth_speakers import _worker_main; _worker_main()"
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(task).encode(), capture_output=True, env=env)
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace")[-2000:]
        raise RuntimeError(f"espeak-ng worker for {task['voice']} failed: {tail}")
    with np.load(task["out"]) as npz:
        waves = [npz[f"arr_{i}"] for i in range(len(task["jobs"]))]
    Path(task["out"]).unlink()
    return waves


def _plan(speakers: int, utterances: int, videos: int, seed: int) -> list[dict]:
    """Per speaker: its settings; per utterance: session, number, text, espeak noise seed."""
    plan = []
    for spk in make_speakers(speakers, seed):
        rng = random.Random(f"{seed}:{spk.spk_id}")
        sessions = []
        for _ in range(videos):  # a session nudges pitch/rate and has its own channel
            sessions.append(
                dict(
                    video=_video_id(rng),
                    pitch=spk.pitch + rng.randint(-4, 4),
                    rate=spk.rate + rng.randint(-8, 8),
                    gain=rng.uniform(0.25, 0.7),
                    snr_db=rng.uniform(38.0, 48.0),
                )
            )
        utts = []
        for i in range(utterances):
            v = i * videos // utterances  # contiguous blocks, as even as possible
            number = i - (v * utterances + videos - 1) // videos + 1
            utts.append(
                dict(session=sessions[v], number=number, text=make_sentence(rng), rand_seed=rng.randrange(1, 2**31))
            )
        plan.append(dict(speaker=spk, utts=utts))
    return plan


def _finish(raw: np.ndarray, session: dict, noise_seed: list[int]) -> np.ndarray:
    """22.05 kHz int16 -> 16 kHz float: resample, set the session's gain, add its noise floor."""
    from mmunlearn.data.audio import resample  # deferred: worker processes import this module, need no torch

    wav = resample(raw.astype(np.float32) / 32768.0, ESPEAK_SR, OUT_SR)
    peak = float(np.max(np.abs(wav))) if wav.size else 0.0
    if peak <= 0:
        raise RuntimeError("espeak-ng produced silence")
    wav = wav * (session["gain"] / peak)
    noise = np.random.default_rng(noise_seed).standard_normal(wav.size).astype(np.float32)
    return wav + noise * session["gain"] * 10 ** (-session["snr_db"] / 20)


def _stamp(speakers: int, utterances: int, videos: int, seed: int) -> dict:
    return {
        "format": FORMAT_VERSION,
        "espeakng_loader": version("espeakng-loader"),
        "speakers": speakers,
        "utterances": utterances,
        "videos": videos,
        "seed": seed,
    }


def synthesize_corpus(
    out: str | os.PathLike,
    speakers: int = 20,
    utterances: int = 30,
    videos: int = 3,
    seed: int = 0,
    jobs: int | None = None,
    progress: bool = True,
) -> Path:
    """Build (or reuse) the synthetic VoxCeleb2-style corpus at ``out``; returns its path.

    ``utterances`` is per speaker, spread over its ``videos`` in contiguous blocks. Skips the work
    when ``out`` holds a corpus stamped with the same options; otherwise builds into a fresh temp
    folder beside ``out`` and swaps it in. Refuses to replace a non-empty folder that is not a
    corpus made here. ``jobs``: worker processes (default: up to 2).
    """
    for name, value, low in (("speakers", speakers, 1), ("videos", videos, 1), ("seed", seed, 0)):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if utterances < videos:
        raise ValueError(f"utterances per speaker ({utterances}) must be >= videos ({videos})")
    out = Path(out).resolve()
    stamp = _stamp(speakers, utterances, videos, seed)
    stamp_path = out / STAMP_NAME
    if stamp_path.is_file():
        if json.loads(stamp_path.read_text()) == stamp:
            return out
    elif out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty and holds no {STAMP_NAME}; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        _build(tmp, stamp, jobs, progress)
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.replace(out, old / "corpus")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build(root: Path, stamp: dict, jobs: int | None, progress: bool) -> None:
    # mmunlearn (and with it torch, ~1.5 s) is imported here, not at module top: every worker
    # process imports this module for _worker_main and needs only numpy + ctypes.
    from mmunlearn.data.audio import save_wav  # deferred: worker processes import this module, need no torch

    seed = stamp["seed"]
    plan = _plan(stamp["speakers"], stamp["utterances"], stamp["videos"], seed)
    tasks = [
        dict(
            voice=p["speaker"].voice,
            out=str(root / f".raw-{s}.npz"),
            jobs=[
                (u["text"], u["session"]["pitch"], p["speaker"].range, u["session"]["rate"], u["rand_seed"])
                for u in p["utts"]
            ],
        )
        for s, p in enumerate(plan)
    ]
    jobs = max(1, min(jobs or min(2, os.cpu_count() or 1), len(tasks)))
    transcripts, meta = [], []
    bar = StageBar(
        total=sum(len(p["utts"]) for p in plan), unit="utt", desc="synthesising speakers", disable=not progress
    )
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # threads only wait on worker processes
        for s, (p, raws) in enumerate(zip(plan, pool.map(_synth_speaker, tasks))):
            spk = p["speaker"]
            for u, (utt, raw) in enumerate(zip(p["utts"], raws)):
                video = utt["session"]["video"]
                rel = Path("dev", "aac", spk.spk_id, video, f"{utt['number']:05d}.wav")
                save_wav(root / rel, _finish(raw, utt["session"], [seed, s, u]), OUT_SR)
                number = f"{utt['number']:05d}"
                transcripts.append(
                    [f"{spk.spk_id}--{video}--{number}", spk.spk_id, video, number, rel.as_posix(), utt["text"]]
                )
            meta.append([f"{spk.spk_id} ", f"n{spk.spk_id[2:]:0>6} ", f"{spk.gender} ", "dev "])
            bar.update(len(raws))
    bar.close()
    _write_csv(root / "vox2_meta.csv", META_HEADER, meta)
    header = ["ID", "spk_id", "video", "utterance", "wav", "text"]
    _write_csv(root / "transcripts.csv", header, transcripts)
    rows = [list(asdict(p["speaker"]).values()) for p in plan]
    _write_csv(root / "speakers.csv", list(asdict(plan[0]["speaker"]).keys()), rows)
    (root / STAMP_NAME).write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)


app = typer.Typer(add_completion=False, help="Synthesise the built-in espeak-ng speaker corpus (VoxCeleb2 layout).")
_Opt = typer.Option


@app.command()
def main(
    out: Annotated[
        Path, _Opt("--out", help="Corpus root to write (VoxCeleb2 layout: dev/aac/idNNNNN/<video>/NNNNN.wav).")
    ],
    speakers: Annotated[int, _Opt(min=1, help="Number of speakers (alternating male/female voices).")] = 20,
    utterances: Annotated[int, _Opt(min=1, help="Utterances per speaker, spread over its videos.")] = 30,
    videos: Annotated[
        int, _Opt(min=1, help="Videos (recording sessions) per speaker; each nudges pitch, rate, gain and noise.")
    ] = 3,
    seed: Annotated[
        int, _Opt(min=0, help="Seed for voices, sentences and sessions; the same seed gives byte-identical files.")
    ] = 0,
    jobs: Annotated[int, _Opt(min=0, help="Worker processes (0: up to 2).")] = 0,
) -> None:
    """Synthesise the corpus; a re-run with the same options does nothing."""
    stamp_path = out / STAMP_NAME
    before = stamp_path.read_text() if stamp_path.is_file() else None
    root = synthesize_corpus(out, speakers, utterances, videos, seed, jobs=jobs or None)
    state = "up to date" if before == (root / STAMP_NAME).read_text() else "written"
    typer.echo(f"{root}: {speakers} speakers x {utterances} utterances ({videos} videos each), {state}")


if __name__ == "__main__":
    app()
