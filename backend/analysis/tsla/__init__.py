"""TSLA (task recognition and task learning heads): head maps, the ICL curve, ablation, steering with extracted
task vectors, hidden-state geometry and demonstration perturbations. One module per kind (its params, result and
function), and the TSLA-only building block `score_heads` (scoring_pass.py)."""
