"""``python -m treeguard``: the command line."""

from treeguard._cli.main import main

if __name__ == "__main__":
    main()
