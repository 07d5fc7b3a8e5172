"""Benchmark recipes (TOFU, cTOFU, VoxCeleb2), one Typer app each, mounted into the mmunlearn CLI."""
