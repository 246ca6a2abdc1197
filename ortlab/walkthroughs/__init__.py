"""Notebook helpers: what one walkthrough prints or draws, kept out of the mirrors.

One module per notebook, named after it (`welcome` for `00_welcome`). These sit on the top floor:
they may import any part of ortlab, and nothing in ortlab imports them.
"""
