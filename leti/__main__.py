from leti.cli import main

main()
