"""Figures (PNG) and the self-contained HTML report."""
