from mtpbench.cli import main

main()
