"""Stored runs as measured cells, what every table, figure and the report read through: the one
grouping rule (settings.py), runs as labelled columns of mean ± std cells (columns.py), a protocol's
axis (axes.py), the marks a cell carries (shot_counts.py, coverage.py, contamination.py), the paper's
cell it stands beside (paper_match.py), the footnotes every view shares, dataset titles, and the
pre-training runs linked to their transfer. It imports only cells.py among the views."""
