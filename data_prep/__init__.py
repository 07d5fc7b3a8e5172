"""Re-runnable dataset preparation: the built-in espeak-ng speaker corpus and VoxCeleb2 forget/retain manifests."""
