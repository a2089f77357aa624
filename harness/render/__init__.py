"""Rows as people read them: number formats, text and markdown tables, plots, panels and the
HTML report."""
