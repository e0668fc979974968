"""A bench's last line: its headline, ending in PASS or FAIL, and the exit status to match.

`make bench` reads each script's last line as its headline and its exit status as the verdict,
so a FAIL (or a crash before the headline) fails the target.
"""

from __future__ import annotations


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def finish(headline: str, ok: bool) -> int:
    """Print ``headline`` ending in PASS or FAIL; returns the exit status (1 on FAIL)."""
    print(f"{headline} {verdict(ok)}")
    return 0 if ok else 1
