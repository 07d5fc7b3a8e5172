"""The speech-LLM family (kind ``speech-llm``, transformers' Qwen2-Audio architecture): its adapter and kind
(adapter.py), its families (families.py: one row each), a Whisper encoder and a causal LM put together (assemble.py),
a model built from a config (build.py) and its folders read and written (io.py)."""
