"""``python -m ampmeter``: the command-line interface."""

from ampmeter.cli import main

if __name__ == "__main__":
    main()
