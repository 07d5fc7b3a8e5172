"""``mmunlearn bench requests``: deletion requests at service speed, a benchmark flow (it builds a corpus or a TOFU
world and trains models), so it lives with the recipes and joins ``mmunlearn bench`` through the entry-point group
``mmunlearn.bench``. Its settings are one :class:`recipes.requests.config.RequestsConfig` (a config command:
options, ``--config FILE.yaml`` or a shipped ``requests/<name>``, ``KEY=VALUE``; :mod:`recipes.recipe_cli`)."""

from __future__ import annotations

import typer
from rich.console import Console

from mmunlearn.errors import set_threads
from mmunlearn.files.atomic import write_text_atomic
from recipes.recipe_cli import config_command
from recipes.requests import speaker as rb
from recipes.requests.config import RequestsConfig
from recipes.requests.tofu import run_tofu

console = Console()


def _show_request(row: rb.RequestRow) -> None:
    """Print one request's row of ``bench requests`` as it is measured."""
    console.print(
        f"  request {row.request} {row.method:9s} {row.extract or '':9s} {row.seconds:8.2f} s "
        f"(method {row.method_seconds:.2f} s)  forget {row.forget_before:.3f} -> {row.forget_after:.3f} "
        f"(target {row.forget_target:.3f})  retain {row.retain_after - row.retain_before:+.4f} "
        f"(bound {row.retain_bound:g})  peak +{row.peak_extra_mb:.0f} MiB"
        + (
            ""
            if row.forgotten_any is None
            else f"  forgotten -> any forgotten {100 * row.forgotten_any:.1f} %, largest share on one retained "
            f"speaker {100 * row.forgotten_sink:.1f} %"
        ),
        soft_wrap=True,
    )


def _print_batch(batch: dict) -> None:
    """Print the batch line of ``bench requests``: the union's edit against the requests one by one."""
    console.print(
        f"batch of {len(batch['forget_nll_union'])} requests ({batch['extract']} extraction), edited once "
        f"with the union in {batch['union_method_seconds']:.1f} s (rule met: "
        f"{batch['union_target_reached']}): {'identical to' if batch['identical'] else 'differs from'} "
        f"one by one (largest relative weight difference {batch['max_relative_weight_difference']:.3g}); "
        f"forget NLL union {[round(x, 3) for x in batch['forget_nll_union']]} vs one by one "
        f"{[round(x, 3) for x in batch['forget_nll_one_by_one']]}; retain NLL "
        f"{batch['retain_nll_union']:.4f} vs {batch['retain_nll_one_by_one']:.4f}",
        soft_wrap=True,
    )


def _print_requests_result(res: rb.BenchResult, preset: str) -> bool:
    """Print the ``bench requests`` table, batch, retrained-model and verdict lines; whether the target was met."""
    console.print(
        f"[bold]Deletion requests, {res.dataset}, {preset} preset, QR-Erase scope "
        f"{res.setup.get('scope', 'all')}, retain state prepared once in {res.prepare_seconds:.1f} s[/bold]",
        soft_wrap=True,
    )
    console.print(rb.markdown(res), soft_wrap=True, markup=False, highlight=False)  # never cut at 80 columns
    summary = res.summary()
    batch = res.setup.get("batch")
    if batch:
        _print_batch(batch)
    retrained = res.setup.get("retrained")
    if retrained:
        console.print(
            f"retrained model (retained speakers only): forgotten -> any forgotten "
            f"{100 * retrained['forgotten_any']:.1f} %, largest share on one retained speaker "
            f"{100 * retrained['forgotten_sink']:.1f} % (the last request's row should match these)",
            soft_wrap=True,
        )
    best = [s for s in summary if s["method"] == "qr-erase"]
    ok = any(s["speedup_vs_grad_diff"] >= rb.TARGET_SPEEDUP and s["met_rule"] == s["requests"] for s in best)
    console.print(
        f"{'[green]PASS[/green]' if ok else '[red]MISS[/red]'}  a QR-Erase request (retain state cached) "
        f"{rb.TARGET_SPEEDUP:g}x faster than GradDiff, every request meeting the rule: "
        + ", ".join(f"{s['extract']} {s['speedup_vs_grad_diff']:.1f}x, {s['met_rule']}/{s['requests']}" for s in best)
    )
    return ok


#: the command's own options beside OPTIONS' preset and data; every other setting is KEY=VALUE
REQUESTS_OPTIONS = ("dataset", "workdir", "json", "markdown", "strict")
#: a throwaway app the command is made in: ``mmunlearn bench`` mounts the function (entry point ``mmunlearn.bench``)
_app = typer.Typer()


@config_command(
    _app, RequestsConfig, name="requests", benchmark="requests", options=REQUESTS_OPTIONS, kind=None, listed=False
)
def requests(cfg: RequestsConfig) -> None:
    """Deletion requests at service speed: time per request after the first with the retain state cached
    (QR-Erase) against GradDiff reaching the same forget criterion, the rule's measures and peak memory."""
    set_threads(cfg.threads)
    res = run_tofu(cfg, show=_show_request) if cfg.dataset == "tofu" else rb.run_speaker(cfg, show=_show_request)
    ok = _print_requests_result(res, cfg.resolved_preset())
    if cfg.json is not None:
        rb.write_json(cfg.json, res)
        console.print(f"wrote {cfg.json}")
    if cfg.markdown is not None:
        cfg.markdown.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cfg.markdown, rb.markdown(res) + "\n")
    if cfg.strict and not ok:
        raise typer.Exit(1)
