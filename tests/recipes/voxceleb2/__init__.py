"""The speaker benchmark (recipes/voxceleb2/) on every model family: config, tables, hf-audio, speech LLM, and a
family added from outside the repository."""
