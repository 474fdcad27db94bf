"""The evaluation protocols, one module each behind one interface (base.py), found through a
registry that other packages extend with the `vitbench.protocols` entry-point group.

May import: the engine and everything below it; never execution, a view, the API or the CLI."""
