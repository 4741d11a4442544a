"""LTV (learned task vectors): train a vector through the frozen model (`ltv_vector`), compare it with ICL and the
extracted vectors and explain it (`ltv`), across tasks (`ltv_tasks`). Building blocks used by LTV only: `recipe`
(the training recipe's params and result), `learn` (the training loop), `propagation` (the mechanism)."""
