"""``lightning.pytorch.utilities.exceptions`` under the rename.

Trainwright raises built-in types for a bad configuration (``ValueError``, ``TypeError``, naming the value and the
fix), never `MisconfigurationException`: catch those. The class is here for code that raises it itself.
"""

from __future__ import annotations


class MisconfigurationException(Exception):
    """Lightning's exception for a bad configuration (Trainwright's own errors are ``ValueError``/``TypeError``)."""


__all__ = ["MisconfigurationException"]
