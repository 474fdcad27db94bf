"""How sure a cell is, and how two are compared: `--ci`'s bootstrap intervals, each cell's paired
test against its baseline cell (significance.py), and `vitbench compare A B` (paired_compare.py),
on the methods over per-image predictions (methods.py: bootstrap, McNemar's exact test, Holm).
It reads the measured cells (views/measured/) and imports no table, figure or report."""
