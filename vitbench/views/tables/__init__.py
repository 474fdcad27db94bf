"""Every `vitbench table` view: the paper's layouts (table.py: Tables 2, 5, 6, 9), robustness,
calibration and per-class, pre-training, attention distances, throughput, the cell export, and
the renderers (render.py: rich, Markdown, LaTeX, CSV, HTML). It imports the measured cells and the
statistics, never a figure or the report."""
