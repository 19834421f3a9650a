"""Model cards: the format, the built-in cards (``cards/``), presets, families, pipeline defaults and truncation
(pure, no torch; the importer that builds cards from diffusers classes is ``importer/``)."""
