"""Where a model's files come from: presets, pulls, GGUF reading and conversion, model cards."""
