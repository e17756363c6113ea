"""Public type aliases."""

from typing import Tuple, Union

#: A queue key: ``str``, ``int`` (signed 64-bit; ``bool`` counts), ``bytes``,
#: or tuples of these, nested. ``get()`` returns a key equal to the one added.
Key = Union[str, int, bytes, Tuple["Key", ...]]
