from vitbench.cli import main

main()
