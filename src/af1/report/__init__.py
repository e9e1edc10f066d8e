"""The interactive figures (plotly, each saved as SVG from the page) and the self-contained HTML report."""
