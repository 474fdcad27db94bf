"""Files vitbench reads and writes, and the text it prints: atomic writes that readers see whole or
not at all (atomic.py), the checks of every path it is asked to write (out_paths.py), opt-in
downloads and the user's cache folder (downloads.py), names made safe for a terminal, a spreadsheet
or a page (text_safety.py).

May import: vitbench.errors only; everything else imports it."""
