"""What a reader sees: the paper's tables (rich, Markdown, LaTeX, CSV, HTML), the plots, the
throughput table and the §4.5 inspection figures. Views only read the store."""
