"""The sections of bench/real_findings.py (TSLA, SITE, LTV): each `plan`, `measure`, `summary` and `render`."""
