"""`vitbench report`: the store as one web page (report.py), its summary (summary.py), its HTML
parts, each escaping what it inserts (report_page.py), and the user's paths kept off it
(private_paths.py). It may import every room below it: tables, figures, statistics, measured."""
