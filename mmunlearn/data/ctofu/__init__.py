"""Cross-lingual TOFU (cTOFU): the worlds of one run (worlds.py), each language's source opened (sources.py), a
built-in multilingual stand-in (synthetic.py) and the row alignment of translations with English (align.py)."""
