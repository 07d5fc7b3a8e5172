"""Untrusted model folders and caches: shard names, links, pickles, configs, templates, T3 heads, CTranslate2 files."""
