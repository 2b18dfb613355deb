"""``python -m ampmeter``: the command-line interface."""

from ampmeter._console_script import main

if __name__ == "__main__":
    main()
