"""``python -m flotilla ARGS`` is ``flotilla ARGS``."""

import os
import sys

from flotilla import find_flotilla_bin


def main() -> None:
    try:
        binary = find_flotilla_bin()
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    os.execv(binary, [binary, *sys.argv[1:]])


if __name__ == "__main__":
    main()
