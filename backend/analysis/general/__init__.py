"""Kinds that belong to no one paper: `model_info` (the model), `fit` (does a task fit the model), `head` (one head
on one prompt); and `train_default`, which trains the embedded default model."""
