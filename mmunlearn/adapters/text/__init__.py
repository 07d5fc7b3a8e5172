"""The text-LLM family (kind ``text``, any Hugging Face causal LM): its adapter and kind (adapter.py), chat templates
rendered in a bounded sandbox (chat_template.py), the prompt formats a row is written in (prompt_format.py) and the
small tokenizers of the built-in presets (tokenizer.py)."""
