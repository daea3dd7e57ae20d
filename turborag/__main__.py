from turborag.cli import main

main()
