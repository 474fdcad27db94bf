from vitbench.cli import entry

entry()
