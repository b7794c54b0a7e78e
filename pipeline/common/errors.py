"""The one error type for mistakes a user can fix (bad params, missing data, absent device).

Stage scripts turn it into a single paragraph on stderr and a non-zero exit, never a traceback:
the message itself must say what was wrong and how to fix it.
"""

from __future__ import annotations


class PipelineError(Exception):
    """A problem the user can fix; the message names the param/file and the fix."""
