"""SITE (soft head selection): per-head alphas that inject an ICL task embedding (`site`), and their transfer
across tasks (`site_transfer`). Building blocks used by SITE only: `recipe` (the training recipe's params),
`soft_select` (embedding, training, saving) and `generate` (greedy generation with the KV cache)."""
