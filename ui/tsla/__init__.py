"""The TSLA pages' own figures (the head maps, ICL and ablation curves, shared by every page, are ui/figures.py)."""
