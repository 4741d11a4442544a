"""Self-contained HTML files: plotly figures with their settings, and the findings report."""
