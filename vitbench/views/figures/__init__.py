"""Every `vitbench plot` figure and the kit that lays them out and saves them (figure_kit.py):
VTAB groups, cost, training curves, accuracy along a protocol's axis, checkpoint series, confusion,
pre-training data size and compute, the §4.5 inspection figures and dedup's contact sheets. It
imports the measured cells, never a table or the report."""
