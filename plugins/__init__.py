"""vitbench's built-in backends. Installed as `vitbench_plugins`; registered through the
`vitbench.backends` entry-point group exactly like a third-party backend package."""
