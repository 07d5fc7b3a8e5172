"""Model presets built from configs (micro, mini): tokenizer, architecture, pretraining base."""
