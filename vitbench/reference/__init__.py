"""Numbers vitbench ships rather than measures: the paper's own tables (paper.py, read from
results/paper/*.csv) and the GPU rates measured with `vitbench bench` that price a plan for a GPU
one does not have (shipped_rates.py). Data beside measured rows, never mixed into them.

May import: vitbench.catalog (a plugin's paper rows) and below; never the store or anything above."""
