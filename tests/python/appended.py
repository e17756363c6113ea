"""Reading a record that other processes append to, one ``os.write`` per
line: each call gives the complete lines added since the last one (a line
still being written waits for the next call)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Union


class AppendedLines:
    def __init__(self, path: Union[str, Path]) -> None:
        self.path = path
        self._offset = 0

    def new(self) -> List[str]:
        """The complete lines appended since the last call (none if the
        file does not exist yet)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return complete.decode().splitlines()
