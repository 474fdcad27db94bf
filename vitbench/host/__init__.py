"""The machine and the process vitbench runs in, and its manners there: the accelerator, its name,
peak and device-seconds (devices.py); how long torch's threads spin (cpu_waiting.py); log lines on
whatever stderr is (logs.py); a library call leaving its host as it found it (state.py).

May import: vitbench.datasets (the object-store clients a call opened) and below; never the engine,
the protocols, the store or anything above."""
